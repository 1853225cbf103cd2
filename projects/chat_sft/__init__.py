"""Chat supervised fine-tuning of a Qwen2 / Llama causal LM on ``messages`` conversations,
rendered with the checkpoint's chat template (see README.md)."""
