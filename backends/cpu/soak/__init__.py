"""python -m backends.cpu soak: one long real run with drawn faults, judged as it goes, its
processes' memory, files and threads sampled."""
