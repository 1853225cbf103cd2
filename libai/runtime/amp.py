"""Mixed precision for eager mode: ``torch.autocast`` plus a mesh-wide dynamic loss scaler.

bf16 needs no scaling. fp16 scales the loss so small gradients survive, and when any
gradient of any rank overflows, *every* rank skips the step together (a scaler deciding per
rank would let tensor-parallel shards of one weight diverge).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor

AMP_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def resolve_amp_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"fp16"`` (or a dtype) -> dtype; ``None`` means fp32 (no autocast)."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in AMP_DTYPES:
        raise ValueError(f"train.amp.dtype must be one of {sorted(AMP_DTYPES)}, got {name!r}")
    return AMP_DTYPES[name]


def autocast(device_type: str, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype``, or a null context for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


class DynamicLossScaler:
    """Loss scaling for fp16 with a decision shared by all ranks.

    ``scale`` multiplies the loss before backward; :meth:`unscale_` divides the gradients back
    and reports whether any rank saw inf/NaN. On overflow the caller skips the optimizer step
    (and the LR schedule) and :meth:`update` halves the scale; after ``growth_interval``
    clean steps the scale doubles.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        min_scale: float = 1.0,
    ):
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.min_scale = growth_interval, min_scale
        self.good_steps = 0
        self.skipped_steps = 0

    def unscale_(self, parameters) -> bool:
        """Divide every gradient by the scale; return True if any rank found inf/NaN."""
        inv = 1.0 / self.scale
        grads = [
            p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            for p in parameters
            if p.grad is not None
        ]
        device = grads[0].device if grads else torch.device("cpu")
        found = torch.zeros((), device=device)
        for g in grads:
            g.mul_(inv)
            found = torch.maximum(found, (~torch.isfinite(g)).any().to(found.dtype))
        if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
            torch_dist.all_reduce(found, op=torch_dist.ReduceOp.MAX)
        return bool(found.item())

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale = min(self.scale * self.growth_factor, 2.0**24 * self.growth_factor**8)
            if not math.isfinite(self.scale):
                self.scale = 2.0**24

    def state_dict(self) -> dict:
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
