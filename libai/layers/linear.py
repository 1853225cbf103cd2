"""Linear layer in LiBai's three layouts: data (replicated), col and row parallel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.collectives import (
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
)
from libai.layers.float8 import Float8Matmul, float8_linear
from libai.layers.param import (
    InitMethod,
    create_parameter,
    local_value,
    mark_sequence_parallel,
    xavier_normal,
    zeros,
)

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

    With ``sequence_parallel=True`` (``train.dist.sequence_parallel``; col and row layers of
    a Transformer block) the activations outside the layer are split along the sequence: a
    ``col`` layer all-gathers its input's sequence, a ``row`` layer reduce-scatters its
    output along the sequence, and its bias (added to a sequence shard) is marked for the
    gradient all-reduce over tp.
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
        sequence_parallel: bool = False,
    ):
        super().__init__()
        if parallel not in _PARALLEL_MODES:
            raise ValueError(f"Linear parallel must be one of {_PARALLEL_MODES}, got {parallel!r}")
        #: the mesh this layer was built on: its forward communicates over this mesh's tp group
        self._dist_util = dist.capture_mesh()
        tp = self._dist_util.tensor_parallel_size
        split_dim = {"data": None, "col": 0, "row": 1}[parallel]
        if split_dim is not None:
            size = out_features if parallel == "col" else in_features
            if size % tp:
                side = "out_features" if parallel == "col" else "in_features"
                raise ValueError(
                    f"{parallel}-parallel Linear: {side}={size} is not divisible by "
                    f"tensor_parallel_size={tp}"
                )
        if sequence_parallel and parallel == "data":
            raise ValueError("sequence_parallel applies to col / row parallel Linear layers only")
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel = sequence_parallel
        self.parallel, self.skip_bias_add, self.layer_idx = parallel, skip_bias_add, layer_idx
        self.weight = create_parameter(
            (out_features, in_features), init_method, layer_idx=layer_idx, tp_split_dim=split_dim
        )
        if bias:
            bias_split = 0 if parallel == "col" else None
            self.bias = create_parameter(
                (out_features,), zeros, layer_idx=layer_idx, tp_split_dim=bias_split
            )
            if parallel == "row" and sequence_parallel:
                mark_sequence_parallel(self.bias)
        else:
            self.register_parameter("bias", None)
        #: float8 matmul settings (``train.amp.fp8``; :mod:`libai.layers.float8`), or None
        self.float8: Float8Matmul | None = None
        #: a low-rank adapter (:class:`libai.layers.lora.LoRA`), or None
        self.lora = None

    def forward(self, x: torch.Tensor):
        if self.parallel == "row" and not self.sequence_parallel:
            x = self._split_whole_input(x)
        if self.lora is not None:
            out = self._forward(x)
            if self.skip_bias_add:
                return self.lora.add_to(out[0], x), out[1]
            return self.lora.add_to(out, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor):
        weight = local_value(self.weight)
        bias = None if self.bias is None else local_value(self.bias)
        if self.parallel == "col":
            if self.sequence_parallel:
                # [S(0), S(1)] -> all-gather -> [S(0), B]  (reduce-scatter dx backward)
                x = gather_from_sp(x, self._dist_util.tp_group)
            else:
                # [S(0), B] -> [S(0), B]  (no comm forward; all-reduce dx backward)
                x = copy_to_tp(x, self._dist_util.tp_group)
            # [S(0), B] x [B, S(0)]^T -> [S(0), S(-1)]
            out = self._matmul(x, weight, None if self.skip_bias_add else bias)
        elif self.parallel == "row":
            if x.shape[-1] != weight.shape[1]:  # a shape comparison: no compute, no sync
                self._raise_row_input(x.shape[-1], weight.shape[1])
            # [S(0), S(-1)] x [B, S(1)]^T -> [S(0), P]
            partial = self._matmul(x, weight, None)
            if self.sequence_parallel:
                # [S(0), P] -> reduce-scatter -> [S(0), S(1)]  (all-gather dy backward)
                out = reduce_scatter_to_sp(partial, self._dist_util.tp_group)
            else:
                # [S(0), P] -> all-reduce -> [S(0), B]
                out = reduce_from_tp(partial, self._dist_util.tp_group)
            if bias is not None and not self.skip_bias_add:
                out = out + bias
        else:
            # [S(0), B] x [B, B]^T -> [S(0), B]
            out = self._matmul(x, weight, None if self.skip_bias_add else bias)
        if self.skip_bias_add:
            return out, bias
        return out

    def _matmul(self, x, weight, bias):
        if self.float8 is None:
            return F.linear(x, weight, bias)
        return float8_linear(x, weight, bias, self.float8)

    def _split_whole_input(self, x: torch.Tensor) -> torch.Tensor:
        """A row-parallel Linear given the whole input (LiBai's row-parallel heads on a
        pooled output, which OneFlow's boxing splits): this rank's share of it."""
        local = self.in_features // self._dist_util.tensor_parallel_size
        if x.shape[-1] != self.in_features or local == self.in_features:
            return x
        # [S(0), B] -> [S(0), S(-1)]  (all-gather dx backward)
        return scatter_to_tp(x, self._dist_util.tp_group)

    def _raise_row_input(self, given: int, local: int):
        tp = self.in_features // local
        hint = " (the full, unsplit input)" if given == self.in_features and tp > 1 else ""
        raise ValueError(
            f"{type(self).__name__}(parallel='row', in_features={self.in_features}, "
            f"out_features={self.out_features}, layer_idx={self.layer_idx}) expects an input "
            f"whose last dim is this rank's share of in_features, {local} "
            f"(= {self.in_features} / tp {tp}), got {given}{hint}; pair it with a "
            f"column-parallel Linear (parallel='col') before it, or split the input over tp "
            f"(scatter_to_tp)"
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, parallel={self.parallel}, layer_idx={self.layer_idx}"
            + (", sequence_parallel=True" if self.sequence_parallel else "")
            + (f", float8={self.float8.recipe}" if self.float8 is not None else "")
        )
