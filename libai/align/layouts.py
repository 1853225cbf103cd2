"""Which activations of libai layers are tensor-parallel shards, and how to make them whole.

libai layers compute on local tensors (see :mod:`libai.layers.collectives`): most module
outputs are replicated over the tp group, but a column-parallel ``Linear`` returns its output
split on the last dim, ``LMLogits`` returns this rank's (padded) vocabulary slice, and the
inputs of a row-parallel ``Linear`` and of ``ParallelCrossEntropyLoss`` are such shards (so
are the gradients recorded for them). :class:`Layout` describes one such tensor; ``gather``
all-gathers it over the tp group and cuts vocabulary padding, so a tp run's dump holds the
same full tensors as a single-process run.

A tensor that reaches the recorder as a ``DTensor`` carries its own layout and is gathered
with ``full_tensor()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.tensor import DTensor

from libai import dist
from libai.layers import Linear, LMLogits, ParallelCrossEntropyLoss


@dataclass(frozen=True)
class Layout:
    """A local tensor split along ``dim`` over the tp group; ``logical`` trims padding."""

    dim: int = -1
    logical: int | None = None

    def describe(self) -> tuple[list[str], dict]:
        """``(placements, mesh)`` as written in report.json."""
        tp = dist.get_tensor_parallel_size()
        return [f"S({self.dim})"], {"dim_names": ["tp"], "shape": [tp]}


def tp_size() -> int:
    """The tensor-parallel size, 1 without a mesh."""
    try:
        return dist.get_tensor_parallel_size()
    except Exception:  # no dist util set up: a plain single-process run
        return 1


def output_layouts(module: nn.Module) -> dict[int, Layout]:
    """Layouts of ``module``'s sharded outputs under tp > 1, by flattened output index."""
    if isinstance(module, Linear) and module.parallel == "col":
        shard = {0: Layout()}
        if module.skip_bias_add and module.bias is not None:
            shard[1] = Layout()
        return shard
    if isinstance(module, LMLogits):
        return {0: Layout(logical=module.vocab_size)}
    return {}


def input_layouts(module: nn.Module, vocab_size: int | None) -> dict[int, Layout]:
    """Layouts of ``module``'s sharded differentiable inputs under tp > 1, by index."""
    if isinstance(module, Linear) and module.parallel == "row":
        return {0: Layout()}
    if isinstance(module, ParallelCrossEntropyLoss):
        return {0: Layout(logical=vocab_size)}
    return {}


def model_vocab_size(model: nn.Module) -> int | None:
    """The (unpadded) vocabulary size of the model's LM head, if it has one."""
    for m in model.modules():
        if isinstance(m, LMLogits):
            return m.vocab_size
    return None


def gather(t: torch.Tensor, layout: Layout | None) -> torch.Tensor:
    """The full tensor: a DTensor's ``full_tensor()``, or ``t`` all-gathered along
    ``layout.dim`` over the tp group (a collective of that group), trimmed to
    ``layout.logical``."""
    if isinstance(t, DTensor):
        return t.full_tensor()
    if layout is None or tp_size() == 1:
        return t
    group = dist.get_dist_util().tp_group
    parts = [torch.empty_like(t) for _ in range(torch_dist.get_world_size(group))]
    torch_dist.all_gather(parts, t.contiguous(), group=group)
    full = torch.cat(parts, dim=layout.dim)
    if layout.logical is not None:
        full = full.narrow(layout.dim, 0, layout.logical)
    return full


def describe(t: torch.Tensor, layout: Layout | None) -> tuple[list[str] | None, dict | None]:
    """``(placements, mesh)`` for report.json; ``(None, None)`` for a replicated tensor."""
    if isinstance(t, DTensor):
        mesh = t.device_mesh
        return [str(p) for p in t.placements], {
            "dim_names": list(mesh.mesh_dim_names or ()),
            "shape": list(mesh.shape),
        }
    if layout is None or tp_size() == 1:
        return None, None
    return layout.describe()
