"""A libai model as the generation loops see it: "next-token logits after these sequences".

:class:`ModelStepper` owns the :class:`~libai.layers.KVCache` of one generation and feeds the
model only the tokens not yet cached. It works on any pipeline stage: each stage runs its own
layers (``model.decode_stage`` / ``encode_stage``) and hands hidden states to the next through
:class:`~libai.inference.stage_comm.StagePipe`; the last stage returns full-vocabulary logits
and :meth:`share` broadcasts what it decides to the other stages.

A model generates when it defines ``decode_stage(x, attention_mask, position_ids, cache)``
(decoder-only: GPT-2, Llama, Qwen2) or ``encode_stage`` + ``decode_stage(x, position_bias,
cache=, encoder_states=, encoder_mask=)`` (encoder-decoder: T5, mT5).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from libai.inference.stage_comm import StagePipe
from libai.layers.kv_cache import KVCache
from libai.models.utils.hf_export import model_libai_cfg


@torch.no_grad()
def use_decode_layout(model: nn.Module) -> int:
    """Store every 2-D weight of ``model`` column-major (``W.t()`` contiguous), in place.

    ``F.linear(x, W)`` multiplies by ``W.t()``; with that contiguous the GEMM streams the
    weight in its natural order, which on CPU makes the skinny products of decoding (a few
    rows times a large weight) up to ~2x faster (the tied GPT-2 head at batch 8: 23 -> 13 ms)
    at no memory cost: same values, same shapes, other strides. Parameters that are
    DTensors (tensor-parallel stages) are left as they are. Returns the number of weights
    changed.
    """
    changed = 0
    for param in model.parameters():
        if param.dim() == 2 and type(param.data) is torch.Tensor and param.is_contiguous():
            param.data = param.data.t().contiguous().t()
            changed += 1
    return changed


class ModelStepper:
    """Step a libai model through generation on this rank's pipeline stage.

    Args:
        model: a generative libai model, already pruned to this rank's stage under pp.
        pipe: the stage messenger (a single stage by default).
        amp_dtype: run the forward under ``torch.autocast`` with this dtype (e.g. bf16).
        decode_layout: store the weights column-major first (:func:`use_decode_layout`; it
            changes the model's parameter strides in place, not their values).
    """

    def __init__(
        self,
        model: nn.Module,
        pipe: StagePipe | None = None,
        amp_dtype=None,
        decode_layout: bool = False,
    ):
        if not hasattr(model, "decode_stage"):
            raise TypeError(
                f"{type(model).__name__} cannot generate text: text generation supports "
                "decoder-only (GPT-2, Llama, Qwen2) and encoder-decoder (T5, mT5) models"
            )
        self.model, self.pipe, self.amp_dtype = model, pipe or StagePipe(), amp_dtype
        if decode_layout:
            use_decode_layout(model)
        self.is_encoder_decoder = hasattr(model, "encode_stage")
        self.is_last = self.pipe.is_last
        hparams = model_libai_cfg(model)
        self.vocab_size = hparams["vocab_size"]
        #: longest sequence the model can position (None: relative positions, no limit)
        self.max_positions = hparams.get("max_seq_length") or hparams.get("max_position_embeddings")
        if self.is_encoder_decoder:
            self.max_positions = None
        self.cache: KVCache | None = None

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.pipe.device.type, dtype=self.amp_dtype)

    def start(self, input_ids, attention_mask, expand: int, max_length: int) -> None:
        """Begin a generation: a fresh cache for ``max_length`` positions; encoder-decoder
        models encode ``input_ids`` (each row repeated ``expand`` times) once, here."""
        self.cache, self.cached = KVCache(max_length), 0
        self.padded = attention_mask is not None and not bool(attention_mask.all())
        if not self.is_encoder_decoder:
            return
        ids = input_ids.repeat_interleave(expand, dim=0)
        mask = attention_mask.repeat_interleave(expand, dim=0)
        with self._autocast():
            states = self.pipe.run(self.model.encode_stage, ids, mask)
        if self.pipe.num_stages > 1:  # every decoder stage attends to it
            (states,) = self.pipe.broadcast_from_last((states,))
        self.encoder_states, self.encoder_mask = states, mask if self.padded else None

    def next_logits(self, sequences: torch.Tensor, attention_mask: torch.Tensor):
        """Float32 logits ``[B, vocab]`` of the token after ``sequences`` on the last stage
        (None elsewhere), feeding only the tokens the cache has not seen."""
        new = sequences[:, self.cached :]
        if self.is_encoder_decoder:
            stage = functools.partial(
                self.model.decode_stage,
                cache=self.cache,
                encoder_states=self.encoder_states,
                encoder_mask=self.encoder_mask,
            )
        else:
            # left padding: a token's position counts the real tokens before it
            positions = (attention_mask.cumsum(-1) - 1).clamp_(min=0)[:, self.cached :]
            mask = attention_mask if self.padded else None

            def stage(x):
                return self.model.decode_stage(x, mask, positions, self.cache)

        with self._autocast():
            logits = self.pipe.run(stage, new)
        self.cached = sequences.shape[1]
        return None if logits is None else logits.float()

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search: keep cache rows ``beam_idx``."""
        self.cache.reorder(beam_idx)

    def share(self, tensors: tuple) -> tuple:
        """The last stage's ``tensors`` on every stage."""
        return self.pipe.broadcast_from_last(tensors)
