"""The language-model loss without the ``[tokens, vocab]`` logits: head + cross entropy by chunks.

``ParallelCrossEntropyLoss()(LMLogits(hidden), labels)`` holds every token's (vocab-split)
logits at once, and the loss keeps an fp32 softmax of the same size for backward: at a 128k
vocabulary the largest activation of the model. :func:`chunked_lm_loss` computes the same
loss and the same gradients with only ``chunk_size`` tokens' logits alive at a time, in
forward and in backward:

- forward, per chunk of tokens: this rank's vocab shard of the logits ``h_c @ W^T``, the
  vocab-parallel cross entropy (:func:`~libai.layers.cross_entropy.vocab_parallel_cross_entropy`)
  and each token's log-normalizer ``logsumexp(logits)`` (one fp32 per token) are computed,
  then the chunk's logits are freed;
- backward, per chunk: the logits are recomputed (one extra head matmul), ``softmax =
  exp(logits - logsumexp)`` needs no communication, and ``d hidden`` and ``d W`` follow
  (``d W`` accumulated in fp32 over the chunks).

Saved for backward: the hidden states (which the plain head saves as well), the labels and
the log-normalizers, instead of ``[tokens, V/tp]`` fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from libai.layers.cross_entropy import (
    data_parallel_token_mean,
    tp_rank,
    vocab_parallel_cross_entropy,
)
from libai.layers.lm_logits import LMLogits


def lm_head_input(hidden: torch.Tensor, lm_head: LMLogits) -> torch.Tensor:
    """``hidden`` as ``lm_head``'s matmul reads it: entered into the head's tensor-parallel
    region (backward all-reduces ``d hidden`` over tp; with the head's ``sequence_parallel``
    the sequence shards are all-gathered first, see :func:`~libai.layers.lm_logits.enter_head`)
    and cast to the autocast dtype when autocast is on (what autocast does to a matmul's
    input).

    A last pipeline stage returns this from its forward (inside the runner's autocast) and
    hands it to ``chunked_lm_loss(..., prepared=True)`` in its loss (outside autocast).
    """
    device_type = hidden.device.type
    dtype = (
        torch.get_autocast_dtype(device_type)
        if torch.is_autocast_enabled(device_type)
        else hidden.dtype
    )
    return lm_head.enter(hidden).to(dtype)


def check_loss_chunk_size(value) -> int | None:
    """A model's ``loss_chunk_size``: ``None`` (the plain head + loss, all logits at once) or
    the positive number of tokens per chunk of :func:`chunked_lm_loss`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"loss_chunk_size must be None (no chunking) or a positive number of tokens, "
            f"got {value!r}"
        )
    return value


def _chunk_logits(hidden, weight, bias, real_columns: int) -> torch.Tensor:
    """fp32 logits of one chunk on this rank's vocab columns, padding columns masked."""
    # [S(0), B] x [S(0), B]^T -> [S(0), S(-1)]  (vocab-split logits, no comm)
    logits = F.linear(hidden, weight, bias)
    if real_columns < logits.shape[-1]:
        logits[:, real_columns:] = torch.finfo(logits.dtype).min
    return logits.float()


def _chunks(num_tokens: int, chunk_size: int):
    for start in range(0, num_tokens, chunk_size):
        yield slice(start, min(start + chunk_size, num_tokens))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of ``cross_entropy(hidden @ W^T + b, target)``, chunk by chunk.

    ``hidden`` ``[N, H]`` is the head's input in its compute dtype; ``weight`` ``[V/tp, H]``
    and ``bias`` are this rank's vocab shards in any dtype (cast to ``hidden``'s for the
    matmuls, their gradients accumulate in fp32); ``real_columns`` of the ``V/tp`` are vocab,
    the rest padding; ``tp_group`` is the head's tensor-parallel group. Returns the fp32 sum
    of the per-token losses (ignored tokens add 0).
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, target, ignore_index, chunk_size, real_columns, tp_group
    ):
        ctx.ignore_index, ctx.chunk_size, ctx.real_columns = ignore_index, chunk_size, real_columns
        ctx.tp_group = tp_group
        dtype = hidden.dtype
        # explicit dtypes below: the matmuls in the head's compute dtype, the softmax in fp32
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            log_normalizer = torch.empty(hidden.shape[0], dtype=torch.float32, device=w.device)
            for rows in _chunks(hidden.shape[0], chunk_size):
                logits = _chunk_logits(hidden[rows], w, b, real_columns)
                ce = vocab_parallel_cross_entropy(
                    logits, target[rows], ignore_index, tp_group, in_place=True
                )
                total += ce.loss.sum()
                log_normalizer[rows] = ce.log_normalizer
                del logits, ce  # the chunk's [rows, V/tp] buffers go before the next chunk
        ctx.save_for_backward(hidden, weight, bias, target, log_normalizer)
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total):
        hidden, weight, bias, target, log_normalizer = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype, vocab_per_rank = hidden.dtype, weight.shape[0]
        start = tp_rank(ctx.tp_group) * vocab_per_rank
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if need_weight
            else None
        )
        grad_bias = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        )
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            for rows in _chunks(hidden.shape[0], ctx.chunk_size):
                h, t = hidden[rows], target[rows]
                # softmax over the whole vocab from the saved log-normalizer: no communication
                grad = _chunk_logits(h, w, b, ctx.real_columns)
                grad.sub_(log_normalizer[rows].unsqueeze(-1)).exp_()
                ignored = t == ctx.ignore_index
                local = t - start
                own = (local >= 0) & (local < vocab_per_rank) & ~ignored
                token = torch.arange(grad.shape[0], device=grad.device)
                grad[token, local.masked_fill(~own, 0)] -= own.to(grad.dtype)
                # d loss / d logits = (softmax - onehot) * d total, 0 on ignored tokens
                grad.mul_((grad_total * (~ignored).to(grad.dtype)).unsqueeze(-1))
                grad = grad.to(dtype)
                if grad_hidden is not None:
                    # [S(0), S(-1)] x [S(0), B] -> [S(0), P]  (lm_head_input reduces it over tp)
                    grad_hidden[rows] = grad @ w
                if grad_weight is not None:
                    if dtype == torch.float32:
                        grad_weight.addmm_(grad.t(), h)
                    else:
                        grad_weight += grad.t() @ h
                if grad_bias is not None:
                    grad_bias += grad.sum(dim=0)
                del grad
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def chunked_lm_loss(
    hidden: torch.Tensor,
    lm_head: LMLogits,
    labels: torch.Tensor,
    chunk_size: int,
    ignore_index: int = -100,
    *,
    prepared: bool = False,
) -> torch.Tensor:
    """``ParallelCrossEntropyLoss(ignore_index)(lm_head(hidden), labels)`` computed
    ``chunk_size`` tokens at a time: the mean token cross entropy over the positions whose
    label is not ``ignore_index`` (0 when there are none), with the same gradients into
    ``hidden``, the head's weight (tied to the word embedding or its own) and its bias.

    Args:
        hidden: ``[..., hidden]`` final hidden states (replicated over tp; this rank's share
            of the sequence ``[batch, seq / tp, hidden]`` if the head is sequence-parallel),
            or with ``prepared=True`` the output of :func:`lm_head_input`.
        lm_head: the (vocab-split) :class:`LMLogits` head.
        labels: ``[...]`` target token ids, shaped like ``hidden`` without its last dim.
        chunk_size: tokens per chunk; the last chunk may be smaller.
    """
    if check_loss_chunk_size(chunk_size) is None:
        raise ValueError("chunk_size must be a positive number of tokens, got None")
    if not prepared:
        hidden = lm_head_input(hidden, lm_head)
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels of shape {tuple(labels.shape)} do not match hidden states of shape "
            f"{tuple(hidden.shape)}"
        )
    weight, bias = lm_head.local_weight_and_bias()
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"hidden states of size {hidden.shape[-1]} do not fit the LM head (hidden size "
            f"{weight.shape[-1]})"
        )
    flat = hidden.reshape(-1, hidden.shape[-1])
    target = labels.reshape(-1)
    total = _ChunkedLinearCrossEntropy.apply(
        flat,
        weight,
        bias,
        target,
        ignore_index,
        chunk_size,
        lm_head.local_vocab_columns(),
        lm_head.tp_group,
    )
    count = (target != ignore_index).sum()
    cp_group = lm_head._dist_util.cp_group
    if cp_group is not None:  # the token mean of the whole sequences (see ParallelCrossEntropyLoss)
        return data_parallel_token_mean(total, count, cp_group)
    return total / count.clamp(min=1)
