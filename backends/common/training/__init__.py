"""What is learned: the policy, GRPO losses, tasks and rewards, prompt data, HF checkpoints, a
character tokenizer, one-process GRPO and the training flags."""
