"""A tiny Llama with LoRA adapters and its single-process reference run, for the LoRA
layout tests (tests/distributed/test_lora_layouts.py)."""

from __future__ import annotations

import dataclasses
import zlib

import torch
from gpt_reference import SEED
from moe_reference import TINY_MOE_LLAMA, moe_batch, train
from torch.distributed.tensor import DTensor, distribute_tensor

from libai import dist
from libai.models import LlamaForCausalLM
from libai.models.lora import LoRAConfig, apply_lora, merge_lora
from libai.models.utils.hf_export import full_value
from libai.models.utils.model_loader.base_loader import logical_shape
from libai.runtime.parallel import ModelRunner

#: q and v (segments of the fused projection), the row-parallel o_proj and down_proj, the
#: column-parallel gate_proj, the vocab-parallel token embedding (A split on the vocab)
LORA = LoRAConfig(
    target_modules=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "embed_tokens"),
    r=4,
    lora_alpha=8,
)
#: the same adapters, and the (vocab-parallel) LM head trained whole (PEFT's modules_to_save)
LORA_SAVED = dataclasses.replace(LORA, modules_to_save=("lm_head",))
CONFIGS = {"adapters": LORA, "saved": LORA_SAVED, "tied": LORA}
#: an odd vocabulary: tp2 pads the table, the head and the embedding adapter's A to 98 rows
LORA_LLAMA = {**TINY_MOE_LLAMA, "vocab_size": TINY_MOE_LLAMA["vocab_size"] + 1}
lora_batch = moe_batch


@torch.no_grad()
def build_lora_llama(config: LoRAConfig = LORA, tied: bool = False) -> LlamaForCausalLM:
    """The base (``tied``: its LM head tied to the embedding), its adapters attached, and
    every adapter weight set to a seeded value (PEFT starts one of A and B at zero, which
    would leave the other's first gradients zero)."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(**LORA_LLAMA, tie_word_embeddings=tied)
    apply_lora(model, config)
    for name, p in model.named_parameters():
        if not getattr(p, "libai_lora", False) or p.is_meta:  # (meta: another stage's)
            continue
        seed = zlib.crc32(name.encode())  # by name: a stage's parameter list is not the model's
        shape = logical_shape(p)  # the vocab padding (tp) stays zero
        full = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.2
        full = torch.nn.functional.pad(full, [0, p.shape[-1] - shape[-1]])
        if isinstance(p, DTensor):
            p.copy_(distribute_tensor(full.to(p.device), p.device_mesh, p.placements))
        else:
            p.copy_(full)
    return model


def lora_state(model, with_grads=False) -> dict[str, torch.Tensor]:
    """Full (gathered) values, or gradients, of the parameters that have them."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if with_grads else p
        if t is None:
            continue
        out[name] = full_value(t.detach(), p).clone()
    return out


def merged_weights(model) -> dict[str, torch.Tensor]:
    """The base weights with the adapters folded in (the model is changed)."""
    merge_lora(model)
    return lora_state(model)


def lora_reference_run(
    microbatches: int = 1,
    peft_dir: str | None = None,
    config: LoRAConfig = LORA,
    tied: bool = False,
) -> dict:
    """One process; with ``peft_dir`` the trained adapters are exported there as a PEFT
    directory."""
    dist.setup_dist_util({})
    model = build_lora_llama(config, tied)
    init = lora_state(model)
    out = train(ModelRunner(model, num_microbatches=microbatches), lora_batch, lora_state)
    out.pop("optimizer")
    if peft_dir is not None:
        from libai.models.lora_peft import save_peft_adapter

        save_peft_adapter(model, config, peft_dir)
    states = {"init": init, "final": lora_state(model), "merged": merged_weights(model)}
    if tied:  # a pipeline's last stage holds a copy of the table for the head: the same values
        for state in states.values():
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return {**out, **states}
