"""The GPU backend (python -m backends.gpu): Megatron-core or FSDP2 trainers, SGLang or local
engines, NCCL or CUDA IPC (its own code runs on CPU for tests), and the device check."""
