"""Weight-transfer benchmark: the real backend's bucketed path next to its ceiling.

``python -m backends.bench transfer`` moves a state dict from one source rank
to N receiver ranks over torch.distributed (gloo on CPU; NCCL written for CUDA)
and times, side by side in one run, the project's bucketed transfer (the
backend's own send and receive code among them), the ceiling (the fastest of
several ways to move the same bytes between the same processes), one call per
tensor (naive) and a memory copy.
"""
