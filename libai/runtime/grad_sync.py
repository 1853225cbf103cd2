"""Gradient and loss synchronization after backward, on the mesh a model was built on.

:class:`GradientSync` applies, in this order:

- **tied weights across stages**: the gradients of parameters marked ``libai_tied_group``
  (the word embedding on the first stage and its copy on the last) are summed between the two;
- **data parallel** (dp x cp under context parallel: every rank holding the same
  parameters): the gradients are averaged -- by ZeRO's sharder when ZeRO 2/3 is on, by the
  bucketed all-reduce that overlapped backward when it ran, else by bucketed all-reduces here;
  under expert parallel the experts' gradients (``libai_expert``) are summed over the ranks
  holding the same experts instead (the expert-data group) and divided by the same dp size:
  each already sums the contributions of its ep group's tokens (through the all-to-all);
- **sequence parallel**: the gradients of parameters marked ``libai_sequence_parallel`` are
  summed over tp (:mod:`libai.runtime.sequence_parallel`).

:meth:`GradientSync.reduce_loss` averages a step's loss (and its terms) the same way;
:meth:`GradientSync.clip_` clips by the norm of the whole model over the same groups.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from libai.layers.moe import is_expert_parameter
from libai.runtime.buckets import bucket_tensors
from libai.runtime.grad_clip import clip_grad_norm_
from libai.runtime.sequence_parallel import (
    all_reduce_sequence_parallel_grads,
    sequence_parallel_parameter_names,
)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _average(params, group, size: int) -> None:
    """The gradients of ``params`` summed over ``group`` (none: this rank's) and divided by
    ``size``, in buckets."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    for bucket in bucket_tensors(grads):
        flat = _flatten_dense_tensors(bucket)
        if group is not None:
            torch_dist.all_reduce(flat, group=group)
        flat /= size
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(synced)


class GradientSync:
    """The gradient reductions of ``model`` (after its pipeline split) on ``util``'s mesh.

    Args:
        overlap: all-reduce the dp gradients in buckets while backward runs
            (:class:`~libai.runtime.grad_overlap.OverlappedGradReducer`), where it applies:
            not under pipeline parallel (``pipeline``), not with ZeRO 2/3.
    """

    def __init__(self, model: nn.Module, util, *, overlap: bool = True, pipeline: bool = False):
        self.model, self.util = model, util
        self.overlap, self.pipeline = overlap, pipeline
        self.tied_parameters = [
            p for p in model.parameters() if getattr(p, "libai_tied_group", None) is not None
        ]
        self.sequence_parallel_names = sequence_parallel_parameter_names(model)

        #: ZeRO stage 2/3 (libai.runtime.zero / fsdp): replaces the dp all-reduce
        self.sharder = None
        self.reducer = None  # the overlapped reducer, built on first use

    def _parameters(self, *, expert: bool) -> list:
        """The model's parameters now (ZeRO-3 replaces them) that are, or are not, expert
        weights sharded over ep (libai.layers.moe: reduced over the expert-data ranks)."""
        return [p for p in self.model.parameters() if is_expert_parameter(p, self.util) == expert]

    def overlapped_reducer(self):
        """The dp all-reduce overlapped with backward, when it applies (built on first use,
        after ZeRO has settled the parameters); the caller arms it before the last backward."""
        util = self.util
        if not self.overlap or util.grad_group is None or self.pipeline:
            return None
        if self.sharder is not None:
            return None
        if self.reducer is None:
            from libai.runtime.grad_overlap import OverlappedGradReducer

            self.reducer = OverlappedGradReducer(
                self._parameters(expert=False), util.grad_group, util.grad_size
            )
        return self.reducer

    def sync(self) -> None:
        """The reductions of the module doc, in its order (the overlapped and ZeRO reducers
        write their results into the grads before the sequence-parallel sums)."""
        util = self.util
        if util.embedding_group is not None:
            for p in self.tied_parameters:
                if p.grad is not None:
                    torch_dist.all_reduce(_local(p.grad), group=util.embedding_group)
        if util.grad_group is not None and self.sharder is not None:
            self.sharder.reduce_gradients()
        elif self.reducer is not None and self.reducer.armed:
            self.reducer.finish()  # launched during backward
        elif util.grad_group is not None:
            _average(self._parameters(expert=False), util.grad_group, util.grad_size)
        experts = self._parameters(expert=True)
        if experts:
            _average(experts, util.expert_grad_group, util.grad_size)
        all_reduce_sequence_parallel_grads(self.model, self.sequence_parallel_names, util.tp_group)

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` (this rank's; 0 on pipeline stages but the last) as the mean over the
        stages and the dp (x cp) ranks, the same on every rank. In place."""
        util = self.util
        if util.pp_group is not None:  # only the last stage has it; others hold 0
            torch_dist.all_reduce(loss, group=util.pp_group)
        if util.grad_group is not None:  # dp (x cp): each rank's share of the mean
            torch_dist.all_reduce(loss, group=util.grad_group)
            loss /= util.grad_size
        return loss

    def clip_(self, max_norm: float, norm_type: float = 2.0, params=None) -> torch.Tensor:
        """Clip by the global gradient norm of the whole (unsharded) model, summed over the
        groups that split it (tp, pp, and dp under ZeRO 2/3); returns the norm. ``params``:
        the tensors holding the gradients (default the model's parameters; the fp32 masters
        under mixed precision O2)."""
        return clip_grad_norm_(
            self.model.parameters() if params is None else params,
            max_norm,
            norm_type,
            dp_sharded=self.sharder is not None,
            shard_group=getattr(self.sharder, "norm_group", None),
            util=self.util,
        )
