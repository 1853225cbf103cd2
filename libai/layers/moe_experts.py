"""The experts of a Mixture-of-Experts layer: stacked weights run as a grouped matmul.

:class:`Experts` holds ``E`` feed-forward experts as ``[E, ...]`` tensors (this rank's
``E / ep`` under expert parallel) and runs rows grouped by expert through
``torch._grouped_mm`` where the device and dtype take it (:func:`grouped_mm_supported`,
tried once), else one matmul per expert: the same numbers. Capacity mode's padded buffers
(every expert the same number of rows) run as batched matmuls (:meth:`Experts.forward_padded`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from libai.layers.mlp import ACTIVATIONS
from libai.layers.param import (
    InitMethod,
    create_parameter,
    default_init_method,
    local_value,
    mark_sequence_parallel,
    zeros,
)

EXPERT_IMPLS = ("auto", "grouped", "looped")


@functools.cache
def grouped_mm_supported(device_type: str, dtype: torch.dtype, hidden: int, ffn: int) -> bool:
    """Whether ``torch._grouped_mm`` runs these shapes on this device (tried once)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x = torch.zeros(2, hidden, device=device_type, dtype=dtype)
        w = torch.zeros(2, ffn, hidden, device=device_type, dtype=dtype)
        offs = torch.tensor([1, 2], device=device_type, dtype=torch.int32)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        return True
    except (RuntimeError, NotImplementedError):
        return False


class Experts(nn.Module):
    """``E`` feed-forward experts stacked: ``w_up [E, F, H]`` (+ ``w_gate`` for a gated
    activation), ``w_down [E, H, F]``; this rank holds ``E / ep`` of them (``Shard(0)``
    over the expert-parallel ranks)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        ffn_hidden_size: int,
        activation: str = "silu",
        gated: bool = True,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        *,
        impl: str = "auto",
        bias: bool = False,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        self.num_experts, self.gated, self.impl = num_experts, gated, impl
        self.act = ACTIVATIONS[activation]
        expert = dict(layer_idx=layer_idx, expert_split=True)
        self.w_up = create_parameter(
            (num_experts, ffn_hidden_size, hidden_size), init_method, **expert
        )
        self.w_gate = (
            create_parameter((num_experts, ffn_hidden_size, hidden_size), init_method, **expert)
            if gated
            else None
        )
        self.w_down = create_parameter(
            (num_experts, hidden_size, ffn_hidden_size),
            output_layer_init_method or init_method,
            **expert,
        )
        self.b_up = self.b_down = None
        if bias:  # [E, F] and [E, H], split over ep like the weights
            self.b_up = create_parameter((num_experts, ffn_hidden_size), zeros, **expert)
            self.b_down = create_parameter((num_experts, hidden_size), zeros, **expert)
        if sequence_parallel:  # each tp rank runs its share of the tokens
            mark_sequence_parallel(self.w_up, self.w_gate, self.w_down, self.b_up, self.b_down)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x [N, H]`` grouped by local expert (``counts [E / ep]`` rows each) -> ``[N, H]``
        (under autocast in its dtype, as a Linear's matmul: autocast does not cover
        ``torch._grouped_mm``)."""
        x = x.to(compute_dtype(x))
        up = local_value(self.w_up)
        grouped = self._use_grouped(x, up)
        mm = functools.partial(_grouped_matmul if grouped else _looped_matmul, counts=counts)
        # [N, H] x [E, F, H]^T (grouped by rows) -> [N, F]
        h = self._add_bias(mm(x, up), self.b_up, counts)
        h = self.act(mm(x, local_value(self.w_gate))) * h if self.gated else self.act(h)
        # [N, F] x [E, H, F]^T -> [N, H]
        return self._add_bias(mm(h, local_value(self.w_down)), self.b_down, counts)

    def forward_padded(self, x: torch.Tensor) -> torch.Tensor:
        """``x [E / ep, C, H]``: every local expert's ``C`` rows (capacity mode's padded
        buffers) -> ``[E / ep, C, H]``, as one batched matmul per projection."""

        def bmm(rows, w, bias):
            # [E, C, H] x [E, F, H]^T -> [E, C, F] (+ [E, 1, F])
            out = torch.bmm(rows, local_value(w).transpose(1, 2).to(rows.dtype))
            return out if bias is None else out + local_value(bias)[:, None].to(rows.dtype)

        h = bmm(x, self.w_up, self.b_up)
        h = self.act(bmm(x, self.w_gate, None)) * h if self.gated else self.act(h)
        return bmm(h, self.w_down, self.b_down)

    @staticmethod
    def _add_bias(rows: torch.Tensor, bias, counts: torch.Tensor) -> torch.Tensor:
        """Each row plus its expert's bias (rows grouped by expert, ``counts`` each)."""
        if bias is None:
            return rows
        bias = local_value(bias)
        expert_of_row = torch.repeat_interleave(
            torch.arange(bias.shape[0], device=rows.device), counts, output_size=rows.shape[0]
        )
        return rows + bias.to(rows.dtype)[expert_of_row]

    def _use_grouped(self, x, w) -> bool:
        if self.impl == "looped":
            return False
        supported = grouped_mm_supported(x.device.type, x.dtype, w.shape[-1], w.shape[-2])
        if self.impl == "grouped" and not supported:
            raise ValueError(
                f"moe.expert_impl='grouped': torch._grouped_mm does not run {x.dtype} "
                f"[{w.shape[-1]} -> {w.shape[-2]}] on {x.device.type} with torch "
                f"{torch.__version__}; use expert_impl='auto' (grouped where it runs) or 'looped'"
            )
        return supported

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, gated={self.gated}, impl={self.impl}"


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` runs in: autocast's where it is on, else ``x``'s."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _grouped_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    offs = counts.cumsum(0).to(torch.int32)
    return torch._grouped_mm(x, w.transpose(-2, -1).to(x.dtype), offs=offs)


def _looped_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    rows = x.split(counts.tolist())
    return torch.cat([r @ w[e].t().to(x.dtype) for e, r in enumerate(rows)])
