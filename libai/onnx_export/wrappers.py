"""Thin ``nn.Module`` wrappers that give each exported graph flat tensor inputs and outputs.

The libai models take and return dicts and nested per-layer caches; an ONNX graph has a flat
list of named tensors. Each wrapper fixes one graph's signature:

- :class:`CausalLMGraph` (GPT-2, Llama / Qwen2): ``input_ids, attention_mask, position_ids
  [, past_key_values.{i}.key/value ...] -> logits [, present.{i}.key/value ...]``.
- :class:`EncoderGraph` (BERT / RoBERTa): ``input_ids, attention_mask, token_type_ids ->``
  every tensor the model's forward returns (e.g. ``last_hidden_state``, ``pooler_output``, or
  ``prediction_logits``, ``seq_relationship_logits`` for ``BertForPreTraining``).
- :class:`T5EncoderGraph`, :class:`T5DecoderGraph`, :class:`T5DecoderWithPastGraph`.

Caches use the models' legacy functional format: per layer ``(self_kv, cross_kv)`` with
``self_kv = (key, value)``, each ``[batch, kv_heads, past_len, head_dim]``.
"""

from __future__ import annotations

import torch
from torch import nn

from libai.models import (
    BertForClassification,
    BertForPreTraining,
    BertModel,
    GPTForPreTraining,
    GPTModel,
    LlamaForCausalLM,
    RobertaForCausalLM,
    RobertaForPreTraining,
    T5ForPreTraining,
)


class UnsupportedModelError(ValueError):
    """The model (class or ``model_type``) cannot be exported to ONNX."""


#: Hugging Face ``model_type`` values whose libai models can be exported (the Mixture-of-
#: Experts families as graphs that run every expert on every token, weighted by the routing:
#: static shapes, ``num_experts / top_k`` times the routed work; see libai.layers.moe)
SUPPORTED_MODEL_TYPES = (
    "gpt2",
    "bert",
    "roberta",
    "t5",
    "mt5",
    "llama",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
)

ENCODER_CLASSES = (
    BertModel,
    BertForPreTraining,
    BertForClassification,
    RobertaForPreTraining,
    RobertaForCausalLM,
)


def model_family(model: nn.Module) -> str:
    """``"causal_lm"``, ``"encoder"`` or ``"t5"``; raises :class:`UnsupportedModelError`."""
    if isinstance(model, (GPTForPreTraining, GPTModel)):
        return "causal_lm"
    if isinstance(model, LlamaForCausalLM):
        from libai.layers.latent_attention import LatentAttention

        if any(isinstance(m, LatentAttention) for m in model.modules()):
            raise UnsupportedModelError(
                "DeepSeek's multi-head latent attention (keys and values of different widths "
                "in the cache) has no ONNX export yet; export GPT-2, Llama / Qwen or the MoE "
                "families with grouped-query attention"
            )
        if model.model.rotary_emb.dynamic:
            raise UnsupportedModelError(
                "rope_scaling type 'dynamic' recomputes the frequencies from the largest "
                "position id at run time, which an ONNX graph cannot express; export a model "
                "with default, linear or llama3 RoPE scaling"
            )
        return "causal_lm"
    if isinstance(model, ENCODER_CLASSES):
        return "encoder"
    if isinstance(model, T5ForPreTraining):
        return "t5"
    raise UnsupportedModelError(
        f"ONNX export does not support {type(model).__name__}; supported: GPT-2 "
        "(GPTForPreTraining, GPTModel), Llama / Qwen2 (LlamaForCausalLM), BERT / RoBERTa "
        "encoders and T5 / mT5 (T5ForPreTraining)"
    )


def self_kv(present) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(key, value)`` of a layer's self-attention from its cache entry, which is either
    ``(key, value)`` or ``((key, value), cross_kv)``."""
    first = present[0]
    return first if isinstance(first, (tuple, list)) else present


def _pairs(past: tuple, per_layer: int) -> list[tuple]:
    return [tuple(past[i : i + per_layer]) for i in range(0, len(past), per_layer)]


class CausalLMGraph(nn.Module):
    """Decoder-only LM (GPT-2 or Llama / Qwen2) as a flat graph.

    Args:
        model: ``GPTForPreTraining`` / ``GPTModel`` / ``LlamaForCausalLM`` (eval mode).
        with_past: the graph takes ``past_key_values`` inputs (2 per layer).
        return_presents: the graph returns ``present`` keys / values (2 per layer).

    ``forward(input_ids, attention_mask, position_ids, *past)``: ``attention_mask`` covers
    the past and the new tokens, ``position_ids`` the new tokens. Returns ``(logits,
    *presents)`` with full-vocabulary logits ``[batch, seq, vocab]``.
    """

    def __init__(self, model: nn.Module, with_past: bool = False, return_presents: bool = False):
        super().__init__()
        self.model = model
        self.with_past, self.return_presents = with_past, return_presents

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = [(kv, None) for kv in _pairs(past, 2)] if self.with_past else None
        use_cache = self.return_presents
        if isinstance(self.model, LlamaForCausalLM):
            out = self.model(
                input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=use_cache,
            )
            logits, presents = out["logits"], out.get("past_key_values") or []
        else:
            gpt = self.model.GPT_model if isinstance(self.model, GPTForPreTraining) else self.model
            out = gpt(input_ids, attention_mask, position_ids, cache, use_cache=use_cache)
            logits, presents = out if use_cache else (out, [])
            logits = gpt.lm_head.gather(logits)
        flat = [t for present in presents for t in self_kv(present)]
        return (logits, *flat)


class EncoderGraph(nn.Module):
    """A BERT / RoBERTa model: ``(input_ids, attention_mask, token_type_ids)`` -> the tensors
    of its output dict, in the order of :attr:`output_names` (set on the first call)."""

    def __init__(self, model: nn.Module, output_names: list[str]):
        super().__init__()
        self.model, self.output_names = model, list(output_names)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(out[name] for name in self.output_names)


class T5EncoderGraph(nn.Module):
    """T5 encoder: ``(input_ids, attention_mask) -> last_hidden_state``."""

    def __init__(self, model: T5ForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.t5_model.encode(input_ids, attention_mask)


class T5DecoderGraph(nn.Module):
    """T5 decoder over the whole decoder prefix: ``(input_ids, encoder_attention_mask,
    encoder_hidden_states) -> logits`` (+ per layer ``present.{i}.decoder.key/value,
    present.{i}.encoder.key/value`` with ``return_presents``)."""

    def __init__(self, model: T5ForPreTraining, return_presents: bool = False):
        super().__init__()
        self.model, self.return_presents = model, return_presents

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states):
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_attn_mask=encoder_attention_mask,
            encoder_states=encoder_hidden_states,
            use_cache=self.return_presents,
        )
        flat = []
        for self_present, cross_present in out.get("past_key_values") or []:
            flat += [*self_present, *cross_present]
        return (out["logits"], *flat)


class T5DecoderWithPastGraph(nn.Module):
    """T5 decoder step(s) after the first: ``(input_ids, encoder_attention_mask, *past)``
    with 4 past tensors per layer (``decoder.key, decoder.value, encoder.key,
    encoder.value``) -> ``logits`` and per layer ``present.{i}.decoder.key/value`` (the
    cross-attention keys / values do not change, keep the ones given)."""

    def __init__(self, model: T5ForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, *past):
        cache = [((d_k, d_v), (e_k, e_v)) for d_k, d_v, e_k, e_v in _pairs(past, 4)]
        t5 = self.model.t5_model
        # the stack directly: the cross-attention keys / values come from the cache, so no
        # encoder output is needed (T5Model.forward insists on one)
        hidden, _, presents = t5.decoder(
            t5.embed(input_ids),
            None,
            encoder_attention_mask=encoder_attention_mask.bool()[:, None, None, :],
            past_key_values=cache,
            use_cache=True,
        )
        logits = self.model.lm_head.gather(self.model._logits(t5._finish(hidden)))
        flat = [t for self_present, _ in presents for t in self_present]
        return (logits, *flat)
