"""Weight-transfer benchmark: the real backend's bucketed path next to its ceilings.

``python -m backends.bench transfer`` moves a state dict from one source rank
to N receiver ranks over torch.distributed (gloo on CPU; NCCL written for CUDA)
and times, side by side in one run, the project's bucketed transfer, one flat
tensor (the backend's ceiling), one call per tensor (naive) and a memory copy.
"""
