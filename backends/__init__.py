"""The real worlds: Ray with torch on CPU, and Megatron-core/SGLang on GPU (later issues)."""
