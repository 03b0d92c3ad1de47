"""The Megatron-core trainer model and its HF<->Megatron weight conversion (as miles)."""
