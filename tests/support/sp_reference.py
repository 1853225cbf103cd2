"""Tiny Llama and its single-process reference run for the sequence-parallel tests
(GPT-2's are in gpt_reference)."""

from __future__ import annotations

import torch
from gpt_reference import SEED, build_model, full_state, make_batch, reference_run

from libai import dist
from libai.models import LlamaForCausalLM

TINY_LLAMA = dict(
    hidden_layers=2,
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: one kv head per tp2 rank
    max_position_embeddings=64,
    attention_bias=True,  # a row-parallel bias in the sequence-parallel region
)


def build_llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    return LlamaForCausalLM(**{**TINY_LLAMA, **overrides})


def llama_batch(step: int) -> dict[str, torch.Tensor]:
    """Unshifted labels (the model shifts them)."""
    ids = make_batch(step, TINY_LLAMA["vocab_size"])["input_ids"]
    return {"input_ids": ids, "labels": ids.clone()}


def llama_state(model, with_grads=False) -> dict[str, torch.Tensor]:
    """Full (gathered) parameter values, or gradients, by name."""
    return {
        name: dist.ttol((p.grad if with_grads else p).detach()).clone()
        for name, p in model.named_parameters()
    }


def llama_reference_run() -> dict:
    return reference_run(build=build_llama, batch=llama_batch, state=llama_state)


#: (build, batch, state) of each decoder the layout scripts run against its reference
MODELS = {
    "gpt": (build_model, make_batch, full_state),
    "llama": (build_llama, llama_batch, llama_state),
}
