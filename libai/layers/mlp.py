"""Feed-forward block: column-parallel up projection, activation, row-parallel down projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai.layers.linear import Linear
from libai.layers.param import InitMethod, default_init_method

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class MLP(nn.Module):
    """``dense_4h_to_h(act(dense_h_to_4h(x)))``, or the gated form ``act(gate(x)) * up(x)``.

    ``activation`` is one of :data:`ACTIVATIONS`; ``gated=True`` with ``"silu"`` is SwiGLU
    (Llama), with ``"gelu_tanh"`` gated GELU (T5 v1.1).

    With ``sequence_parallel=True`` input and output are this rank's share of the sequence
    ``[S(0), S(1)]`` (see :class:`~libai.layers.Linear`).
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        output_dropout_prob: float = 0.0,
        activation: str = "gelu",
        gated: bool = False,
        bias: bool = True,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        *,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation, self.gated, self.layer_idx = activation, gated, layer_idx
        self.act = ACTIVATIONS[activation]
        sp = dict(layer_idx=layer_idx, sequence_parallel=sequence_parallel)
        # [S(0), B] x [B, S(0)]^T -> [S(0), S(-1)]
        # (sequence parallel: [S(0), S(1)] -> all-gather -> [S(0), B] first)
        self.dense_h_to_4h = Linear(hidden_size, ffn_hidden_size, bias, "col", init_method, **sp)
        self.dense_gate = (
            Linear(hidden_size, ffn_hidden_size, bias, "col", init_method, **sp) if gated else None
        )
        # [S(0), S(-1)] x [B, S(1)]^T -> [S(0), P] -> all-reduce -> [S(0), B]
        # (sequence parallel: [S(0), P] -> reduce-scatter -> [S(0), S(1)])
        self.dense_4h_to_h = Linear(
            ffn_hidden_size, hidden_size, bias, "row", output_layer_init_method or init_method, **sp
        )
        self.dropout = nn.Dropout(output_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.dense_h_to_4h(x)
        h = self.act(self.dense_gate(x)) * up if self.gated else self.act(up)
        out = self.dense_4h_to_h(h)
        return self.dropout(out) if self.dropout.p > 0 else out  # skip the identity call
