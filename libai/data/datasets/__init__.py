"""Task datasets built on indexed datasets."""

from libai.data.datasets.gpt_dataset import GPT2Dataset

__all__ = ["GPT2Dataset"]
