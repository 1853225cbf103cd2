"""Linear layer in LiBai's three layouts: data (replicated), col and row parallel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai.layers.collectives import copy_to_tp, reduce_from_tp
from libai.layers.param import InitMethod, create_parameter, local_value, xavier_normal, zeros
from libai.utils import distributed as dist

_PARALLEL_MODES = ("data", "col", "row")


class Linear(nn.Module):
    """``y = x W^T + b`` with the weight laid out over tensor-parallel ranks.

    - ``parallel="data"``: weight ``[B, B]`` (replicated), input and output ``[S(0), B]``.
    - ``parallel="col"``: weight split on the output dim; the output stays split on its last
      dim (feed it to a ``row`` layer).
    - ``parallel="row"``: weight split on the input dim; the input is the split output of a
      ``col`` layer, partial sums are all-reduced, then the (replicated) bias is added.

    With ``skip_bias_add=True`` the forward returns ``(output, bias)`` so the caller can fuse
    the bias into the next op (bias dropout add).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        parallel: str = "data",
        init_method: InitMethod = xavier_normal,
        skip_bias_add: bool = False,
        *,
        layer_idx: int = 0,
    ):
        super().__init__()
        if parallel not in _PARALLEL_MODES:
            raise ValueError(f"Linear parallel must be one of {_PARALLEL_MODES}, got {parallel!r}")
        tp = dist.get_tensor_parallel_size()
        split_dim = {"data": None, "col": 0, "row": 1}[parallel]
        if split_dim is not None:
            size = out_features if parallel == "col" else in_features
            if size % tp:
                side = "out_features" if parallel == "col" else "in_features"
                raise ValueError(
                    f"{parallel}-parallel Linear: {side}={size} is not divisible by "
                    f"tensor_parallel_size={tp}"
                )
        self.in_features, self.out_features = in_features, out_features
        self.parallel, self.skip_bias_add, self.layer_idx = parallel, skip_bias_add, layer_idx
        self.weight = create_parameter(
            (out_features, in_features), init_method, layer_idx=layer_idx, tp_split_dim=split_dim
        )
        if bias:
            bias_split = 0 if parallel == "col" else None
            self.bias = create_parameter(
                (out_features,), zeros, layer_idx=layer_idx, tp_split_dim=bias_split
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor):
        weight = local_value(self.weight)
        bias = None if self.bias is None else local_value(self.bias)
        if self.parallel == "col":
            # [S(0), B] x [B, S(0)]^T -> [S(0), S(-1)]  (no comm forward; all-reduce dx backward)
            x = copy_to_tp(x)
            out = F.linear(x, weight, None if self.skip_bias_add else bias)
        elif self.parallel == "row":
            # [S(0), S(-1)] x [B, S(1)]^T -> [S(0), P] -> all-reduce -> [S(0), B]
            out = reduce_from_tp(F.linear(x, weight))
            if bias is not None and not self.skip_bias_add:
                out = out + bias
        else:
            # [S(0), B] x [B, B]^T -> [S(0), B]
            out = F.linear(x, weight, None if self.skip_bias_add else bias)
        if self.skip_bias_add:
            return out, bias
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, parallel={self.parallel}, layer_idx={self.layer_idx}"
        )
