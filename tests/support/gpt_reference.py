"""Tiny GPT and its single-process reference run, shared by the layout tests."""

from __future__ import annotations

import torch

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallel import ModelRunner

TINY_GPT = dict(
    hidden_layers=4,
    vocab_size=99,  # not a multiple of tp: exercises vocab padding
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
)
SEED = 1234
BATCH, SEQ, STEPS, LR = 8, 12, 3, 0.05
MAX_GRAD_NORM = 0.5  # small enough that every step clips: exercises the global norm


def make_batch(step: int, vocab_size: int = TINY_GPT["vocab_size"]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, vocab_size, (BATCH, SEQ + 1), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def build_model(**overrides) -> GPTForPreTraining:
    torch.manual_seed(SEED)
    return GPTForPreTraining(**{**TINY_GPT, **overrides})


def full_state(model, with_grads=False) -> dict[str, torch.Tensor]:
    """Full (gathered) parameter values, or gradients, by name; padding rows dropped."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if with_grads else p
        full = dist.ttol(t.detach()).clone()
        if "token_embeddings" in name or "lm_head" in name:
            full = full[: TINY_GPT["vocab_size"]]
        out[name.replace("lm_head.weight", "embeddings.token_embeddings.weight")] = full
    return out


#: Gradients, losses and grad norms of two layouts agree to fp32 rounding at their scale: a
#: layout only re-splits sums (tp matmul K-splits, the dp all-reduce, micro-batches).
GRAD_TOL = 1e-5


def max_diff(got: dict, want: dict) -> tuple[float, str]:
    """The largest absolute difference between same-named tensors, and that name."""
    worst, name = 0.0, ""
    for key, value in got.items():
        diff = (value - want[key]).abs().max().item()
        if diff > worst:
            worst, name = diff, key
    return worst, name


def adam_param_tol(lr: float, steps: int) -> float:
    """Tolerance for parameters after ``steps`` Adam(W) steps of two runs whose gradients
    agree only to fp32 rounding (two layouts, or two CPUs whose kernels round differently).

    Adam moves an entry by ``lr * m / (sqrt(v) + eps)`` per step: at most about ``lr``
    whatever the gradient's size, and with slope ``lr / eps`` for gradients near zero. So a
    last-bit difference ``dg`` in a near-zero gradient moves that entry by up to
    ``lr * dg / eps``: with eps=1e-6 and dg of 1e-9..1e-8 that is 1e-5..1e-4 of lr per step,
    seen as 1.1e-5 after 3 steps at lr=0.01 (AMD EPYC, tp2-split matmuls). No tolerance
    tighter than a fraction of ``lr * steps`` survives another machine's kernels.

    A layout bug changes the gradient itself, not its last bits, and Adam turns that into
    O(lr) moves per step: a missing dp all-reduce (each rank stepping on its half batch)
    moves parameters by ~2 * lr * steps (0.06 here). One percent of ``lr * steps`` sits
    ~30x above rounding and ~200x below that; ``test_zero.py`` checks both sides. Gradients
    and norms (where Adam's scale invariance would hide a wrong factor) stay at GRAD_TOL.
    """
    return 1e-2 * lr * steps


def make_optimizer(model):
    """SGD with momentum: linear in the gradients, so layouts agree to fp32 rounding.

    (Adam divides by sqrt(v) and amplifies 1e-8 gradient differences of near-zero entries.)
    """
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def reference_run(
    num_microbatches: int = 1, build=build_model, batch=make_batch, state=full_state
) -> dict:
    """Single-process losses, initial parameters, first-step grads and params after STEPS,
    and then each row's eval loss on ``batch(STEPS)`` (of the tiny GPT, or of the model
    ``build()`` on ``batch(step)``, read by ``state``)."""
    dist.setup_dist_util({})
    model = build()
    init = state(model)
    runner = ModelRunner(model, num_microbatches=num_microbatches)
    opt = make_optimizer(model)
    losses, grads, norms = [], None, []
    for step in range(STEPS):
        loss = runner.forward_backward(batch(step))
        if step == 0:
            grads = state(model, with_grads=True)
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    # each row's eval loss after training: what a partial evaluation batch must average to
    model.eval()
    last = batch(STEPS)
    row_losses = [
        float(runner.eval_loss({k: v[i : i + 1] for k, v in last.items()}))
        for i in range(len(next(iter(last.values()))))
    ]
    model.train()
    return {
        "init": init,
        "losses": losses,
        "grads": grads,
        "grad_norms": norms,
        "final": state(model),
        "row_losses": row_losses,
    }
