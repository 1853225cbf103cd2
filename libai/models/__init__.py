"""Model zoo built from libai.layers."""

from libai.models.gpt_model import GPTForPreTraining, GPTModel

__all__ = ["GPTForPreTraining", "GPTModel"]
