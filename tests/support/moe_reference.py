"""A tiny Mixture-of-Experts Llama and its single-process reference run, for the expert-
parallel layout tests (tests/distributed/test_moe_layouts.py)."""

from __future__ import annotations

import torch
from gpt_reference import MAX_GRAD_NORM, SEED, STEPS, make_batch, make_optimizer

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.models import LlamaForCausalLM
from libai.runtime.parallel import ModelRunner

VOCAB = 96
TINY_MOE_LLAMA = dict(
    hidden_layers=2,
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
#: every balancing term on, so the numbers test their gradients too
MOE = dict(num_experts=4, top_k=2, aux_loss_coeff=0.1, seq_aux_loss_coeff=0.05, z_loss_coeff=0.01)
#: the named variants the layout cases run
VARIANTS = {
    "dropless": MOE,
    # GShard-style token dropping: capacity ceil(0.6 * 12 * 2 / 4) = 4 per expert and sequence
    "capacity": {**MOE, "capacity_factor": 0.6},
    # the same, every expert's buffer padded to its capacity (static shapes)
    "padded": {**MOE, "capacity_factor": 0.6, "pad_to_capacity": True},
    # DeepSeek-V3: sigmoid scores, group-limited choice, an expert bias moved after each
    # step, a shared expert
    "deepseek": {
        **MOE,
        "score_func": "sigmoid",
        "num_groups": 2,
        "topk_groups": 1,
        "expert_bias": True,
        "bias_update_rate": 0.01,
        "routed_scaling_factor": 1.5,
        "shared_expert_ffn_hidden_size": 16,
    },
}


def build_moe_llama(variant: str = "dropless") -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    return LlamaForCausalLM(**TINY_MOE_LLAMA, moe=VARIANTS[variant])


def moe_batch(step: int) -> dict[str, torch.Tensor]:
    ids = make_batch(step, VOCAB)["input_ids"]
    return {"input_ids": ids, "labels": ids.clone()}


def moe_state(model, with_grads=False) -> dict[str, torch.Tensor]:
    """Full (gathered) parameter values or gradients by name (the routers' expert biases,
    parameters without gradient moved by the balancing step, among the values)."""
    out = {  # (ZeRO-2: a rank holds the gradients of what it owns)
        name: dist.ttol((p.grad if with_grads else p).detach()).clone()
        for name, p in model.named_parameters()
        if not with_grads or p.grad is not None
    }
    return out


def momenta(model, optimizer) -> dict[str, torch.Tensor]:
    """SGD's full (gathered) momentum buffer of each parameter, by name."""
    return {
        name: dist.ttol(optimizer.state[p]["momentum_buffer"]).clone()
        for name, p in model.named_parameters()
        if p in optimizer.state
    }


def train(runner: ModelRunner, local_batch, state, optimizer=None) -> dict:
    """STEPS steps (clipped, SGD, the balancing step): losses, their terms, the first
    step's gradients, the clipping norms, the final momenta."""
    model = runner.model
    optimizer = optimizer or make_optimizer(model)
    losses, terms, norms, grads = [], [], [], None
    for step in range(STEPS):
        losses.append(float(runner.forward_backward(local_batch(step))))
        terms.append({k: float(v) for k, v in runner.last_loss_terms.items()})
        if step == 0:
            grads = state(model, with_grads=True)
        runner.optimizer_step(optimizer, max_grad_norm=MAX_GRAD_NORM)
        norms.append(float(runner.last_grad_norm))
    return {
        "losses": losses,
        "terms": terms,
        "grads": grads,
        "grad_norms": norms,
        "momenta": momenta(model, optimizer),
        "optimizer": optimizer,
    }


def moe_reference_run(variant: str, microbatches: int = 1, save_dir: str | None = None) -> dict:
    """One process; with ``microbatches`` the balancing statistics are per micro-batch, as
    in a pipeline's schedule; with ``save_dir`` the trained model and optimizer are saved
    there as the checkpoint ``model_final``."""
    dist.setup_dist_util({})
    model = build_moe_llama(variant)
    init = moe_state(model)
    out = train(ModelRunner(model, num_microbatches=microbatches), moe_batch, moe_state)
    optimizer = out.pop("optimizer")
    if save_dir is not None:
        Checkpointer(model, save_dir, optimizer=optimizer).save("model_final")
    return {"init": init, **out, "final": moe_state(model)}
