"""libai: LiBai-style large Transformer training and serving on PyTorch DTensor."""

__version__ = "0.1.0"
