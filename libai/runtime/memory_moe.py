"""Activation bytes of a Mixture-of-Experts block (route -> dispatch -> experts -> combine),
for the memory estimator (:mod:`libai.runtime.memory_estimator`).

Per micro-batch of ``b`` sequences of ``s`` tokens on a rank: ``t`` tokens routed here (the
block's tokens; a sequence-parallel rank its share), ``k`` choices, ``E`` experts, ``f``
the experts' ffn size, ``h`` hidden, ``e`` compute bytes (4, or 2 under AMP) and ``R`` the
rows this rank's experts take:

- dropless: ``R = t k``. Under expert parallel a rank takes what the router sends it: the
  figure is the balanced expectation, and a skewed router puts more on some ranks;
- capacity: ``R <= min(t k, b E C)`` with ``C = ceil(cf s k / E)`` per sequence: the bound
  (fewer when experts run under capacity);
- padded to capacity: the buffers hold exactly ``b E C`` rows (``S``).

Kept for backward:

- the router (it scores in fp32): its input ``4 h t``, the scores ``4 E t``, the choices
  and their weights ``16 k t`` (int64 ids, fp32 values and weights), with
  ``norm_topk_prob`` the sum ``4 t``, with the z-loss or the sequence-wise loss another
  ``(4 E + 4) t``;
- the experts: their input rows ``e h R`` and ``e a f R`` (``a`` = 4 gated: gate and up
  outputs, the activation and their product; 2 otherwise: the up output and the
  activation), and under AMP the experts' weights cast to the compute dtype (2 bytes
  each);
- the combine: dropless, the rows back in token order in fp32 (``4 h t k``) and two index
  vectors (``16 t k``); capacity, the kept rows in fp32 twice (the weighted product's input
  and the sum's source, ``8 h R``), their weights ``4 R`` and two index vectors ``16 R``;
  padded, the rows back in fp32 (``4 h t k``) and two index vectors (``16 t k``);
- shared experts: a dense MLP on the block's tokens (its input gathered under sequence
  parallel, and cast by each column-parallel layer under AMP: ``e h`` each; its
  column-parallel outputs ``e (w_up + a f) / tp``) and Qwen's sigmoid gate (the shared
  output and the gate, ``e h + e`` per token, plus its input cast under AMP ``e h``).

Checked against the bytes a forward keeps (tests/unit/runtime/test_memory_estimator.py,
within 1 %) on one process: dropless fp32 and bf16, every balancing loss, capacity padded,
shared experts with Qwen's gate. Not checked by a measurement: tp, sequence parallel and
expert parallel.
"""

from __future__ import annotations

import math

from torch import nn

from libai.layers.moe_dispatch import expert_capacity
from libai.layers.param import local_value

_FP32, _INT64 = 4, 8


def moe_geometry(moe: nn.Module) -> dict:
    """What the formulas read of a :class:`~libai.layers.moe.MoE` layer."""
    c, experts = moe.config, moe.experts
    shared = moe.shared_experts
    return {
        "top_k": c.top_k,
        "experts": c.num_experts,
        "ffn": experts.w_up.shape[1],
        "gated": experts.gated,
        "expert_numel": sum(local_value(p).numel() for p in experts.parameters()),
        "capacity_factor": c.capacity_factor,
        "padded": c.pad_to_capacity,
        "norm_topk": c.norm_topk_prob,
        "extra_stats": bool(c.z_loss_coeff or c.seq_aux_loss_coeff),
        "shared_up": (
            0 if shared is None else shared.dense_h_to_4h.out_features * (2 if shared.gated else 1)
        ),
        "shared_ffn": 0 if shared is None else shared.dense_4h_to_h.in_features,
        "shared_gated": shared is not None and shared.gated,
        "shared_gate": moe.shared_expert_gate is not None,
    }


def moe_activation_bytes(geo: dict, hidden: int, tokens: int, settings, tp: int, sp: bool) -> int:
    """Bytes one MoE block's routed part keeps for ``tokens`` tokens of a micro-batch (a
    context-parallel rank's share; module doc); the block's attention half and norms are
    counted by the caller."""
    h, k, n_exp, f = hidden, geo["top_k"], geo["experts"], geo["ffn"]
    e = 2 if settings.amp_dtype is not None else _FP32
    q = tp if sp else 1
    t = tokens / q
    a = 4 if geo["gated"] else 2
    router = t * _FP32 * (h + n_exp + 4 * k + geo["norm_topk"])  # it scores in fp32
    if geo["extra_stats"]:
        router += t * (_FP32 * n_exp + _FP32)
    if geo["capacity_factor"] is None:
        rows = t * k
        combine = t * k * (_FP32 * h + 2 * _INT64)
    else:
        cap = expert_capacity(geo["capacity_factor"], settings.seq_length, k, n_exp)
        slots = settings.micro_batch_size * n_exp * cap
        if geo["padded"]:
            rows = slots
            combine = t * k * (_FP32 * h + 2 * _INT64)
        else:
            rows = min(t * k, slots)
            combine = rows * (2 * _FP32 * h + _FP32 + 2 * _INT64)
    experts = rows * e * (h + a * f)
    if settings.amp_dtype is not None:  # the experts' weights' low-precision copies
        experts += 2 * geo["expert_numel"]
    shared = 0
    if geo["shared_up"]:
        n_col = 2 if geo["shared_gated"] else 1  # its column-parallel layers
        amp = settings.amp_dtype is not None
        into = 0  # fp32 without sequence parallel: the router's input itself
        if amp:  # each column-parallel layer casts its (gathered) input
            into = e * h * n_col * (tokens if sp else t)
        elif sp:
            into = _FP32 * h * tokens
        shared = into + tokens * e * (geo["shared_up"] + n_col * geo["shared_ffn"]) / tp
        if geo["shared_gate"]:  # sigmoid(x w) * shared(x): its output, the gate (input cast)
            shared += t * (e * h + e + e * h * amp)
    return int(math.ceil(router + experts + combine + shared))
