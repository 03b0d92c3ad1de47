"""Tasks a small model learns on CPU: the arithmetic data set and its checkpoint (python -m
backends.tasks make / learn)."""
