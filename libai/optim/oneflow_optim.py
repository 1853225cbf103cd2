"""The optimizers LiBai's configs name through OneFlow (``flow.optim.AdamW``,
``flow.optim.Adam``, ``flow.optim.LAMB``), on torch, with OneFlow's keyword arguments.

``AdamW`` / ``Adam`` are torch's, accepting OneFlow's ``do_bias_correction`` (True: torch's
update; False has no torch counterpart and is refused in one line). ``LAMB`` is layer-wise
adaptive moments (You et al., 2019, "Large Batch Optimization for Deep Learning"), the
update OneFlow's ``flow.optim.LAMB`` computes.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["LAMB", "Adam", "AdamW"]


def _check_bias_correction(do_bias_correction: bool, name: str) -> None:
    if not do_bias_correction:
        raise ValueError(
            f"optim {name}(do_bias_correction=False) has no torch counterpart; set "
            "do_bias_correction=True (the usual Adam update)"
        )


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` with OneFlow's ``do_bias_correction`` keyword."""

    def __init__(self, params, *args, do_bias_correction: bool = True, **kwargs):
        _check_bias_correction(do_bias_correction, "AdamW")
        super().__init__(params, *args, **kwargs)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` with OneFlow's ``do_bias_correction`` keyword."""

    def __init__(self, params, *args, do_bias_correction: bool = True, **kwargs):
        _check_bias_correction(do_bias_correction, "Adam")
        super().__init__(params, *args, **kwargs)


def _norm(t: torch.Tensor) -> torch.Tensor:
    """The L2 norm of a whole parameter (a sharded DTensor's over all its shards)."""
    norm = torch.linalg.vector_norm(t.float())
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class LAMB(torch.optim.Optimizer):
    """LAMB: Adam's moments, the update scaled per parameter by ``||w|| / ||update||``.

    For each parameter ``w`` with gradient ``g`` at step ``t``::

        m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
        u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay w
        w = w - lr * r * u,   r = ||w|| / ||u|| (1 when either norm is 0)

    ``adam_w_mode=False`` adds the weight decay to the gradient (L2) instead of ``u``;
    ``do_bias_correction=False`` drops the ``1 - beta^t`` terms.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adam_w_mode: bool = True,
        do_bias_correction: bool = True,
        amsgrad: bool = False,
    ):
        if amsgrad:
            raise ValueError("optim LAMB(amsgrad=True) is not supported; set amsgrad=False")
        if lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"optim LAMB: invalid lr={lr}, eps={eps} or betas={betas}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            adam_w_mode=adam_w_mode,
            do_bias_correction=do_bias_correction,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"] and not group["adam_w_mode"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat, v_hat = m, v
                if group["do_bias_correction"]:
                    m_hat = m / (1 - beta1**step)
                    v_hat = v / (1 - beta2**step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"] and group["adam_w_mode"]:
                    update = update.add(p, alpha=group["weight_decay"])
                w_norm, u_norm = float(_norm(p)), float(_norm(update))
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * ratio)
        return loss
