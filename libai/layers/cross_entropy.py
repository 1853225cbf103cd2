"""Cross-entropy on vocab-split logits (Megatron's vocab-parallel cross entropy)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.collectives import all_reduce_tp


class VocabShardCrossEntropy(NamedTuple):
    """:func:`vocab_parallel_cross_entropy`'s results for ``N`` tokens (fp32)."""

    loss: torch.Tensor  # [N], 0 at ignored positions
    exp: torch.Tensor  # [N, V/tp], exp(logit - row max) on this rank's columns
    sum_exp: torch.Tensor  # [N], sum of ``exp`` over the whole vocab (all ranks)
    row_max: torch.Tensor  # [N], max logit over the whole vocab
    local_target: torch.Tensor  # [N], target column on this rank (0 where ``outside``)
    outside: torch.Tensor  # [N] bool, target not on this rank (or ignored)
    ignored: torch.Tensor  # [N] bool, target == ignore_index

    @property
    def log_normalizer(self) -> torch.Tensor:
        """``logsumexp`` of each row over the whole vocab: ``softmax = exp(logit - it)``."""
        return self.sum_exp.log() + self.row_max


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    tp_group,
    *,
    in_place: bool = False,
) -> VocabShardCrossEntropy:
    """Per-token cross entropy from this rank's vocab shard of fp32 ``logits`` ``[N, V/tp]``
    over the tensor-parallel ``tp_group`` (``None``: tp == 1, the whole vocab here): three
    all-reduces of ``[N]`` statistics, the full logits never exist anywhere. ``in_place``
    reuses ``logits`` for the shifted logits and their exp.
    """
    # logits [N, V/tp] (S(-1) over tp), target [N] (B over tp)
    vocab_per_rank = logits.shape[-1]
    start = tp_rank(tp_group) * vocab_per_rank
    row_max = all_reduce_tp(logits.max(dim=-1).values, tp_group, torch_dist.ReduceOp.MAX)
    shifted = logits.sub_(row_max.unsqueeze(-1)) if in_place else logits - row_max.unsqueeze(-1)
    ignored = target == ignore_index
    outside = (target < start) | (target >= start + vocab_per_rank) | ignored
    local_target = (target - start).masked_fill(outside, 0)
    rows = torch.arange(logits.shape[0], device=logits.device)
    # [S(0), P] -> all-reduce -> [S(0), B]: the target logit comes from its owning rank
    target_logit = all_reduce_tp(shifted[rows, local_target].masked_fill(outside, 0.0), tp_group)
    exp = shifted.exp_() if in_place else shifted.exp()
    sum_exp = all_reduce_tp(exp.sum(dim=-1), tp_group)
    loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0.0)
    return VocabShardCrossEntropy(loss, exp, sum_exp, row_max, local_target, outside, ignored)


def tp_rank(group) -> int:
    """This rank's index in the tensor-parallel ``group`` (0 for ``None``, tp == 1)."""
    return 0 if group is None else torch_dist.get_rank(group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from this rank's vocab shard; the full logits never exist anywhere."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, tp_group):
        ce = vocab_parallel_cross_entropy(logits.float(), target, ignore_index, tp_group)
        softmax = ce.exp.div_(ce.sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, ce.local_target, ce.outside, ce.ignored)
        return ce.loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside, ignored = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        grad = softmax.clone()
        grad[rows, local_target] -= (~outside).to(grad.dtype)
        grad = grad * grad_loss.masked_fill(ignored, 0.0).unsqueeze(-1)
        return grad, None, None, None


class ParallelCrossEntropyLoss(nn.Module):
    """Mean token cross entropy over the positions whose target is not ``ignore_index``.

    ``logits`` may be this rank's vocab shard (``[..., V/tp]``, from :class:`LMLogits`) or the
    full vocab when tp == 1. Ignored positions are masked out of both the sum and the count
    (never mapped to class 0). Computed in fp32. The tp and dp groups are those of the mesh
    current when the loss is built (the model's).

    Under context parallel each rank holds a share of every sequence: the mean is over the
    valid tokens of the whole sequences (:func:`data_parallel_token_mean` over cp; with
    ``over_data_parallel`` over dp x cp), as one process computes it.
    """

    def __init__(self, ignore_index: int = -100):
        super().__init__()
        self.ignore_index = ignore_index
        self._dist_util = dist.capture_mesh()

    def token_losses(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-position losses (0 at ignored positions), shaped like ``target``."""
        flat_logits, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        if self._dist_util.tp_group is None:
            losses = F.cross_entropy(
                flat_logits.float(), flat_target, ignore_index=self.ignore_index, reduction="none"
            )
        else:
            losses = _VocabParallelCrossEntropy.apply(
                flat_logits, flat_target, self.ignore_index, self._dist_util.tp_group
            )
        return losses.view_as(target)

    def forward(
        self, logits: torch.Tensor, target: torch.Tensor, over_data_parallel: bool = False
    ) -> torch.Tensor:
        """The mean token loss; with ``over_data_parallel`` the mean over the valid tokens of
        the whole data-parallel batch (see :func:`data_parallel_token_mean`)."""
        count = (target != self.ignore_index).sum()
        util = self._dist_util
        if over_data_parallel:
            return data_parallel_token_mean(self._total(logits, target), count, util.grad_group)
        if util.cp_group is not None:
            return data_parallel_token_mean(self._total(logits, target), count, util.cp_group)
        return self._total(logits, target) / count.clamp(min=1)

    def _total(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self._dist_util.tp_group is None:
            # whole vocab here: the kernel sums (same gradients as summing token losses, two
            # autograd nodes fewer)
            total = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                target.reshape(-1),
                ignore_index=self.ignore_index,
                reduction="sum",
            )
        else:
            total = self.token_losses(logits, target).sum()
        return total


def data_parallel_token_mean(total: torch.Tensor, count: torch.Tensor, group) -> torch.Tensor:
    """This rank's share of a token mean over the whole data-parallel batch.

    ``total`` / ``count`` are this rank's loss sum and valid-token count; ``group`` the
    ranks whose tokens make up the batch, whose losses the runtime averages (the dp group;
    dp x cp or cp under context parallel; ``None`` for one rank). The runtime averages
    the ranks' losses (and gradients) over data parallel, so rank ``r`` returns
    ``total_r * dp / sum(count)``: the average is ``sum(total) / sum(count)``, the token mean
    of the global batch -- what LiBai's global tensors compute (its BERT / RoBERTa loss), and
    equal to one process on the same global batch when the ranks hold unequal counts (masked
    LM). One scalar all-reduce over the dp group; none with dp = 1.
    """
    if group is None:
        return total / count.clamp(min=1)
    # [P(dp)] count -> [B] global count (a detached scalar: no gradient flows through it)
    global_count = count.detach().to(torch.float32).clone()
    torch_dist.all_reduce(global_count, group=group)
    dp = torch_dist.get_world_size(group)
    return total * dp / global_count.clamp(min=1)
