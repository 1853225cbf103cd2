"""Models and measurements shared by the memory-estimator test and its dist script."""

from __future__ import annotations

import torch
from memory_probe import held_activation_bytes

from libai.config import LazyCall
from libai.models import GPTForPreTraining, LlamaForCausalLM
from libai.runtime.memory_estimator import TrainSettings, estimate_memory
from libai.runtime.parallel import ModelRunner
from libai.runtime.zero import optimizer_state_bytes

#: big enough that per-token terms dominate the per-block constants (RNG state, stats)
ACT_GPT = dict(
    hidden_layers=2,
    vocab_size=1000,
    hidden_size=128,
    ffn_hidden_size=512,
    num_attention_heads=4,
    max_seq_length=64,
)
#: Llama: RMSNorm, rotary q/k, a gated MLP, grouped kv heads, an untied head
ACT_LLAMA = dict(
    hidden_layers=2,
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=344,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
ACT_BATCH = 4
ACT_SEQ = 64
#: relative tolerance of the activation estimate against the held bytes
ACT_RTOL = 0.01


def local_bytes(tensors) -> int:
    """Bytes of the local shards of ``tensors`` (``None`` skipped)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def measured_state(model, optimizer, grads_after_sync: int) -> dict:
    """What a rank holds after a step: parameters, synced gradients, optimizer state."""
    unique = {id(p): p for p in model.parameters()}.values()
    return {
        "parameters": local_bytes(unique),
        "gradients": grads_after_sync,
        "optimizer": optimizer_state_bytes(optimizer),
    }


def predicted_row(
    model_kwargs: dict, layout, rank: int, model_cls=GPTForPreTraining, **settings
) -> dict:
    """The estimator's row for ``rank`` of ``layout`` as a dict."""
    rows = estimate_memory(LazyCall(model_cls)(**model_kwargs), layout, TrainSettings(**settings))
    row = rows[rank]
    return {
        "parameters": row.parameters,
        "gradients": row.gradients,
        "optimizer": row.optimizer,
        "activations_micro_batch": row.activations_micro_batch,
    }


def activation_case(
    layout,
    rank: int,
    *,
    dp_rank: int = 0,
    model_overrides=None,
    llama: bool = False,
    model_cls=None,
    **runner_kwargs,
) -> dict:
    """Held bytes of one micro-batch of :data:`ACT_GPT` (or :data:`ACT_LLAMA`; with
    ``model_overrides``, e.g. ``loss_chunk_size`` or dropout; ``model_cls`` another class
    taking those keywords) on this rank, and the prediction."""
    model_cls = model_cls or (LlamaForCausalLM if llama else GPTForPreTraining)
    model_kwargs = {**(ACT_LLAMA if llama else ACT_GPT), **(model_overrides or {})}
    torch.manual_seed(0)
    model = model_cls(**model_kwargs)
    amp = runner_kwargs.get("amp_dtype")
    runner = ModelRunner(model, **runner_kwargs)
    g = torch.Generator().manual_seed(dp_rank)
    ids = torch.randint(0, ACT_GPT["vocab_size"], (ACT_BATCH, ACT_SEQ), generator=g)
    held = held_activation_bytes(runner, {"input_ids": ids, "labels": ids})
    mode = runner_kwargs.get("activation_checkpointing") or None
    predicted = predicted_row(
        model_kwargs,
        layout,
        rank,
        model_cls,
        micro_batch_size=ACT_BATCH,
        seq_length=ACT_SEQ,
        amp_dtype=amp,
        checkpointing=mode,
        loss_chunk_size=model_kwargs.get("loss_chunk_size"),
    )["activations_micro_batch"]
    return {"held": held, "predicted": predicted}
