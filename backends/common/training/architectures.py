"""The architectures a checkpoint here may have, by name, without transformers: a command
line offers them as choices before it imports anything heavy (hf_checkpoint.ARCHITECTURES
maps each to its config class)."""

ARCHITECTURE_NAMES = ("llama", "qwen2", "qwen3")
