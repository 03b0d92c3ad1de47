"""The GPU backend: Megatron-core trainers and SGLang engines (runs on CPU for tests)."""
