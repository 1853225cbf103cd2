"""One Hugging Face loader per architecture, on :class:`ModelLoaderHuggerFace`."""

from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace

__all__ = ["ModelLoaderHuggerFace"]
