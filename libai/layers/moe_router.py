"""The router of a Mixture-of-Experts layer and its balancing losses.

A router scores every token against every expert and picks ``top_k`` of them:

- ``score_func="softmax"`` (Mixtral, Qwen-MoE, OLMoE, GShard, Switch): ``p = softmax(x W^T)``,
  the top-k of ``p``; with ``norm_topk_prob`` the k weights are renormalized to sum to 1.
- ``score_func="raw"`` (FleetX's naive and GShard gates): the top-k of the logits, weighted
  by the logits themselves; the balancing losses weigh ``softmax(logits)``.
- ``score_func="sigmoid"`` (DeepSeek-V3): ``s = sigmoid(x W^T)``; the experts are chosen on
  ``s + b`` where ``b`` is a non-learned per-expert bias (auxiliary-loss-free balancing,
  updated after each optimizer step by :meth:`Router.update_expert_bias_`), the weights are
  ``s`` of the chosen ones (renormalized with ``norm_topk_prob``) times
  ``routed_scaling_factor``. With ``num_groups > 1`` the experts are split into groups, each
  group scored by the sum of its two best ``s + b``, and only the ``topk_groups`` best groups
  are eligible (DeepSeek's group-limited routing).

Balancing losses, each a formula over the tokens of the whole data-parallel batch
(:class:`TokenStats` sums the statistics over the ranks that hold other tokens):

- :func:`load_balancing_loss` (Switch / GShard): ``E / (k T^2) * sum_i N_i * P_i`` with ``N_i``
  the tokens routed to expert ``i`` and ``P_i`` the sum of its (normalized) scores; 1.0 when
  routing is uniform;
- :func:`sequence_load_balancing_loss` (DeepSeek-V3's sequence-wise form): the same formula
  per sequence, averaged over the sequences;
- :func:`router_z_loss` (ST-MoE): ``mean_t logsumexp(logits_t)^2``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.param import (
    InitMethod,
    create_parameter,
    default_init_method,
    local_value,
    mark_sequence_parallel,
    zeros,
)

SCORE_FUNCS = ("softmax", "sigmoid", "raw")


class Routing(NamedTuple):
    """One router call over ``T`` tokens."""

    logits: torch.Tensor  #: ``[T, E]`` fp32
    scores: torch.Tensor  #: ``[T, E]`` softmax / sigmoid of the logits
    weights: torch.Tensor  #: ``[T, k]`` the chosen experts' weights
    experts: torch.Tensor  #: ``[T, k]`` the chosen experts' ids
    #: ``[T, E]`` the probabilities the balancing losses weigh: the softmax scores, or the
    #: sigmoid scores normalized over the experts (DeepSeek-V3's ``s'``)
    balance_probs: torch.Tensor


class Router(nn.Module):
    """``x [T, H] -> Routing``; the weight ``[E, H]`` is replicated on every rank (each rank
    scores its own tokens). See the module doc for the scoring rules."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        *,
        score_func: str = "softmax",
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        num_groups: int = 1,
        topk_groups: int | None = None,
        expert_bias: bool = False,
        bias_update_rate: float = 0.0,
        bias: bool = False,
        init_method: InitMethod = default_init_method,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func must be one of {SCORE_FUNCS}, got {score_func!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and num_experts={num_experts}")
        topk_groups = num_groups if topk_groups is None else topk_groups
        if num_experts % num_groups or not 1 <= topk_groups <= num_groups:
            raise ValueError(
                f"group-limited routing needs num_groups ({num_groups}) to divide num_experts "
                f"({num_experts}) and 1 <= topk_groups ({topk_groups}) <= num_groups"
            )
        if num_groups > 1 and top_k > topk_groups * (num_experts // num_groups):
            raise ValueError(
                f"top_k={top_k} exceeds the experts of the topk_groups={topk_groups} groups"
            )
        self.num_experts, self.top_k, self.score_func = num_experts, top_k, score_func
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, routed_scaling_factor
        self.num_groups, self.topk_groups = num_groups, topk_groups
        self.bias_update_rate = float(bias_update_rate)
        self._dist_util = util = dist.capture_mesh()
        self.weight = create_parameter((num_experts, hidden_size), init_method, layer_idx=layer_idx)
        #: the logits' bias (FleetX's gate is an nn.Linear with one)
        self.bias = create_parameter((num_experts,), zeros, layer_idx=layer_idx) if bias else None
        if sequence_parallel:  # each tp rank routes its share of the tokens: partial gradients
            mark_sequence_parallel(self.weight, self.bias)
        if expert_bias:
            #: DeepSeek-V3's ``e_score_correction_bias``: steers the choice, not the weights.
            #: A parameter without gradient (checkpoints and Hugging Face files carry it like
            #: the weights), moved only by :meth:`update_expert_bias_`, the same on every rank
            self.expert_bias = nn.Parameter(
                torch.zeros(num_experts, device=util.device), requires_grad=False
            )
            self.expert_bias.libai_expert_bias = True
            #: tokens routed to each expert since the last bias update (this rank's)
            self.register_buffer(
                "tokens_per_expert", torch.zeros(num_experts, device=util.device), persistent=False
            )
        else:
            self.expert_bias = None

    def forward(self, x: torch.Tensor) -> Routing:
        # [S(0), B] x [B, B]^T -> [S(0), B]: every rank scores its own tokens, in fp32
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else local_value(self.bias).float()
            logits = F.linear(x.float(), local_value(self.weight).float(), bias)
        if self.score_func == "softmax":
            scores = logits.softmax(-1)
        else:
            scores = logits.sigmoid() if self.score_func == "sigmoid" else logits
        choice = scores.detach() if self.expert_bias is None else scores.detach() + self.expert_bias
        if self.num_groups > 1:
            choice = self._limit_groups(choice)
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        if self.expert_bias is not None and self.training and _counting():
            self.tokens_per_expert += torch.bincount(
                experts.flatten(), minlength=self.num_experts
            ).to(self.tokens_per_expert.dtype)
        if self.score_func == "sigmoid":
            probs = scores / scores.sum(-1, keepdim=True)
        else:
            probs = logits.softmax(-1) if self.score_func == "raw" else scores
        return Routing(logits, scores, weights, experts, probs)

    def _limit_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` with the experts outside the ``topk_groups`` best groups at -inf."""
        grouped = choice.view(-1, self.num_groups, self.num_experts // self.num_groups)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        best = group_scores.topk(self.topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)

    @torch.no_grad()
    def update_expert_bias_(self, groups=()) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing step (after the optimizer step):
        ``b_i += rate * sign(mean load - load_i)`` on the token counts since the last update,
        summed over ``groups`` (the ranks that routed other tokens); then the counts restart."""
        if self.expert_bias is None:
            return
        load = self.tokens_per_expert.clone()
        for group in groups:
            torch_dist.all_reduce(load, group=group)
        self.expert_bias += self.bias_update_rate * torch.sign(load.mean() - load)
        self.tokens_per_expert.zero_()

    def extra_repr(self) -> str:
        extra = f", groups={self.topk_groups}/{self.num_groups}" if self.num_groups > 1 else ""
        bias = ", expert_bias" if self.expert_bias is not None else ""
        return f"experts={self.num_experts}, top_k={self.top_k}, {self.score_func}{extra}{bias}"


def _counting() -> bool:
    """A training forward that counts routed tokens: autograd records, and it is not the
    recomputation of a checkpointed block during backward (which would count them twice)."""
    return torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


class TokenStats:
    """Sums of per-token statistics over every token of the data-parallel batch.

    The tokens of one step are spread over the data-parallel (``grad_group``: dp x cp) ranks
    and, under sequence parallel, over the tensor-parallel ranks too. :meth:`total` sums over
    both in forward; in backward it sums the incoming gradients over the data-parallel ranks
    only (each holds its own loss; tp ranks hold copies of one), which, after the runtime's
    gradient average over dp and sum over tp, gives every token the gradient of the global
    formula. :meth:`sequence_total` sums over the tp share of a sequence only.
    """

    def __init__(self, util, sequence_parallel: bool):
        self.grad_group = util.grad_group
        self.tp_group = util.tp_group if sequence_parallel else None
        #: context parallel: each rank holds a share of every sequence of its dp rank
        self.cp_group = util.cp_group

    @property
    def groups(self) -> list:
        """The groups over which the ranks hold other tokens (for the routers' counts)."""
        return [g for g in (self.tp_group, self.grad_group) if g is not None]

    def total(self, t: torch.Tensor) -> torch.Tensor:
        """A statistic of this rank's tokens -> that of the batch's."""
        return _SumTokens.apply(t, self.tp_group, self.grad_group, self.grad_group)

    def sequence_total(self, t: torch.Tensor) -> torch.Tensor:
        """A statistic of this rank's share of its sequences -> that of the sequences (the
        shares: sequence parallel's over tp, copies of one loss; context parallel's over
        cp, ranks with losses of their own, so their gradients sum too)."""
        return _SumTokens.apply(t, self.tp_group, self.cp_group, self.cp_group)

    def batch_total(self, t: torch.Tensor) -> torch.Tensor:
        """A statistic of this rank's whole sequences -> that of the batch's."""
        return _SumTokens.apply(t, None, self.grad_group, self.grad_group)


class _SumTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, tp_group, dp_group, grad_group):
        ctx.grad_group = grad_group
        out = t.clone()
        for group in (tp_group, dp_group):
            if group is not None:
                torch_dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.grad_group is not None:
            grad = grad.contiguous().clone()
            torch_dist.all_reduce(grad, group=ctx.grad_group)
        return grad, None, None, None


def _counts(experts: torch.Tensor, num_experts: int, keep: torch.Tensor | None = None):
    """Assignments per expert over the leading dims of ``experts [..., k]`` -> ``[..., E]``."""
    one_hot = F.one_hot(experts, num_experts).float()
    if keep is not None:
        one_hot = one_hot * keep[..., None]
    return one_hot.sum(-2)


def load_balancing_loss(routing: Routing, top_k: int, stats: TokenStats) -> torch.Tensor:
    """Switch / GShard: ``E / (k T^2) * sum_i N_i P_i`` over the whole batch's ``T`` tokens."""
    num_experts = routing.scores.shape[-1]
    counts = stats.total(_counts(routing.experts, num_experts).sum(0))
    probs = stats.total(routing.balance_probs.sum(0))
    tokens = stats.total(routing.scores.new_tensor(float(routing.scores.shape[0])))
    return num_experts * (counts * probs).sum() / (top_k * tokens * tokens)


def sequence_load_balancing_loss(
    routing: Routing, top_k: int, batch: int, stats: TokenStats
) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise form: the formula of :func:`load_balancing_loss` on each
    of the ``batch`` sequences (tokens ``[batch * seq]``, sequence-major), averaged."""
    num_experts = routing.scores.shape[-1]
    experts = routing.experts.view(batch, -1, top_k)
    counts = stats.sequence_total(_counts(experts, num_experts).sum(1))  # [batch, E]
    probs = stats.sequence_total(routing.balance_probs.view(batch, -1, num_experts).sum(1))
    seq = stats.sequence_total(routing.scores.new_tensor(float(experts.shape[1])))
    per_sequence = num_experts * (counts * probs).sum(-1) / (top_k * seq * seq)
    sequences = stats.batch_total(routing.scores.new_tensor(float(batch)))
    return stats.batch_total(per_sequence.sum()) / sequences


def router_z_loss(routing: Routing, stats: TokenStats) -> torch.Tensor:
    """ST-MoE's z-loss: ``mean_t logsumexp(logits_t)^2`` over the whole batch."""
    z = torch.logsumexp(routing.logits, dim=-1).square().sum()
    tokens = stats.total(routing.logits.new_tensor(float(routing.logits.shape[0])))
    return stats.total(z) / tokens
