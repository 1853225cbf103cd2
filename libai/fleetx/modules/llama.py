"""Llama / Qwen2 supervised fine-tuning as a task module: ``Model.module: LlamaSFTModule``."""

from __future__ import annotations

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import ZooModule, tokenizer_from
from libai.models import LlamaForCausalLM, LlamaModel

__all__ = ["LlamaSFTModule"]


class LlamaSFTModule(ZooModule):
    """:class:`~libai.models.LlamaForCausalLM` on ``SFTDataset`` batches (``input_ids``,
    ``attention_mask``, ``labels`` with the prompt masked out); every dp x tp x pp layout.

    ``Model`` keys: ``pretrained`` (a Hugging Face Llama / Qwen2 directory: shapes and
    weights from it), ``tokenizer`` (a tokenizer directory or ``tokenizer.json``; default
    the pretrained directory), or Llama's hyper-parameters for a model from scratch, whose
    ``vocab_size`` defaults to the tokenizer's padded to a multiple of
    ``make_vocab_size_divisible_by`` (128), the same on every layout. The Engine hands the tokenizer
    to the dataset (``Data.Train.dataset.name: SFTDataset``).
    """

    model_class = LlamaForCausalLM
    config_class = LlamaModel
    aliases = {"num_hidden_layers": "hidden_layers"}
    head_keys = ("make_vocab_size_divisible_by",)

    def __init__(self, cfg):
        model_cfg = cfg.Model
        self._divisible_by = int(model_cfg.get("make_vocab_size_divisible_by", 128))
        self.tokenizer = tokenizer_from(model_cfg.get("tokenizer"), model_cfg.get("pretrained"))
        super().__init__(cfg)

    def model_kwargs(self) -> dict:
        kwargs = super().model_kwargs()
        kwargs.pop("make_vocab_size_divisible_by", None)
        if not self.cfg.Model.get("pretrained") and kwargs.get("vocab_size") is None:
            kwargs["vocab_size"] = self.tokenizer.padded_vocab_size(self._divisible_by)
        return kwargs

    def input_spec(self):
        vocab = self.model.model.embed_tokens.num_embeddings
        return [InputSpec([None, None], "int64", "input_ids", high=vocab)]
