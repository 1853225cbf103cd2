"""Mixture of Experts: the layer the Transformer block takes in place of its MLP.

``MoE(x)``: route -> dispatch -> expert FFN -> combine (+ shared experts):

1. **route** (:class:`~libai.layers.moe_router.Router`): each token picks ``top_k`` experts
   and their weights;
2. **dispatch**: the assignments are sorted by expert (dropping those over capacity in
   capacity mode, :func:`~libai.layers.moe_dispatch.capacity_keep`; with
   ``pad_to_capacity`` each expert gets a zero-padded buffer of exactly its capacity,
   :class:`~libai.layers.moe_dispatch.PaddedSlots`); under expert parallel
   (``train.dist.expert_parallel_size``) they travel to the rank holding their expert and
   back (:func:`~libai.layers.moe_dispatch.exchange`);
3. **expert FFN** (:class:`Experts`): the experts' weights are stacked ``[E, ...]`` and run
   grouped (``torch._grouped_mm`` where the device and dtype take it, else one matmul per
   expert: the same numbers);
4. **combine**: each output row times its routing weight, summed back into its token.

Layout: expert weights are ``Shard(0)`` over the ``ep`` ranks (which are data-parallel
ranks: each holds ``E / ep`` experts), replicated over the rest. Experts are not
tensor-parallel: a tp rank holds whole experts, because splitting an expert's few hundred
columns over tp would trade one all-to-all for an all-reduce per expert call. Without
sequence parallel the tp ranks route the same tokens (the routed part runs tp times);
under sequence parallel each routes its share of the sequence and the router and expert
gradients are summed over tp like the norms'. The balancing losses (see
:mod:`~libai.layers.moe_router`) join the gradient through the layer's output
(:func:`aux_loss_grad_scale`) on every layout, pipeline stages included, and are logged as
the model's ``moe_*_loss`` terms (:func:`collect_moe_losses`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from libai import dist
from libai.layers.linear import Linear
from libai.layers.mlp import MLP
from libai.layers.moe_dispatch import (
    PaddedSlots,
    Permutation,
    capacity_slots,
    exchange,
    exchange_padded,
    expert_capacity,
)
from libai.layers.moe_experts import EXPERT_IMPLS, Experts
from libai.layers.moe_router import (
    Router,
    TokenStats,
    load_balancing_loss,
    router_z_loss,
    sequence_load_balancing_loss,
)
from libai.layers.param import (
    InitMethod,
    default_init_method,
    local_value,
    mark_sequence_parallel,
)
from libai.utils.keys import dataclass_items


@dataclass(frozen=True)
class MoEConfig:
    """The Mixture-of-Experts settings of a model (``moe=dict(...)`` in its config).

    Which blocks: layer ``i`` is MoE unless ``i < first_dense_layers``, ``i`` is in
    ``dense_layers`` or ``(i + 1) % layer_freq != 0`` (Qwen-MoE's ``decoder_sparse_step``,
    DeepSeek's ``first_k_dense_replace``).
    """

    num_experts: int
    top_k: int = 2
    #: the hidden size of each routed expert (default: the model's ffn size)
    expert_ffn_hidden_size: int | None = None
    score_func: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    num_groups: int = 1
    topk_groups: int | None = None
    #: DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias on the choice,
    #: moved by ``bias_update_rate`` after each optimizer step
    expert_bias: bool = False
    bias_update_rate: float = 0.0
    #: None: dropless; else each expert takes ``ceil(cf * seq * k / E)`` per sequence
    capacity_factor: float | None = None
    #: capacity mode with every expert's buffer padded to its capacity: static shapes (no
    #: host sync; CUDA graphs, ``fullgraph`` compile and export take it), the same numbers
    pad_to_capacity: bool = False
    aux_loss_coeff: float = 0.0
    seq_aux_loss_coeff: float = 0.0
    z_loss_coeff: float = 0.0
    #: shared experts (always on; DeepSeek's n_shared_experts x size, Qwen-MoE's one)
    shared_expert_ffn_hidden_size: int = 0
    #: Qwen-MoE's ``sigmoid(x w) * shared(x)``
    shared_expert_gate: bool = False
    #: a bias on the router's logits (FleetX's gate is an nn.Linear)
    router_bias: bool = False
    #: biases in the experts' two linear layers (FleetX's ExpertLayer)
    ffn_bias: bool = False
    layer_freq: int = 1
    first_dense_layers: int = 0
    dense_layers: tuple[int, ...] = field(default_factory=tuple)
    expert_impl: str = "auto"

    def __post_init__(self):
        if self.expert_impl not in EXPERT_IMPLS:
            raise ValueError(f"moe.expert_impl must be one of {EXPERT_IMPLS}")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"moe.capacity_factor must be > 0 or None, got {self.capacity_factor}")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError(
                "moe.pad_to_capacity=True needs moe.capacity_factor (the capacity to pad to); "
                "set capacity_factor (e.g. 1.25) or pad_to_capacity=False"
            )
        if self.num_experts < 1 or self.layer_freq < 1:
            raise ValueError("moe.num_experts and moe.layer_freq must be positive")

    @classmethod
    def of(cls, value) -> MoEConfig | None:
        """``value`` (a mapping, an omegaconf node or a MoEConfig; None or 0 experts = dense)
        as a MoEConfig; an unknown key raises naming the closest valid one."""
        if value is None or isinstance(value, MoEConfig):
            return value
        items = dataclass_items(cls, value, "moe")
        if not items.get("num_experts"):
            return None
        if "dense_layers" in items:
            items["dense_layers"] = tuple(int(i) for i in items["dense_layers"] or ())
        return cls(**items)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (
            layer_idx >= self.first_dense_layers
            and layer_idx not in self.dense_layers
            and (layer_idx + 1) % self.layer_freq == 0
        )


# ---- the balancing losses' way into the gradient --------------------------------------------
_AUX_GRAD_SCALE = [1.0]


@contextlib.contextmanager
def aux_loss_grad_scale(scale: float):
    """The factor the runtime applies to the loss before backward (fp16 loss scale / number
    of micro-batches): the balancing losses, which enter backward through the layers'
    outputs rather than the loss, get the same one."""
    previous, _AUX_GRAD_SCALE[0] = _AUX_GRAD_SCALE[0], float(scale)
    try:
        yield
    finally:
        _AUX_GRAD_SCALE[0] = previous


class _AttachLoss(torch.autograd.Function):
    """Identity on ``out``; in backward ``loss`` receives the gradient ``scale`` as if it had
    been added to the model's loss (Megatron's aux-loss auto-scaler)."""

    @staticmethod
    def forward(ctx, out, loss):
        ctx.loss_shape = loss.shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_full(ctx.loss_shape, _AUX_GRAD_SCALE[0], dtype=torch.float32)


def collect_moe_losses(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weighted balancing losses of ``model``'s MoE layers from their last forward,
    summed over layers, detached (for the log: their gradient already flows through the
    layers): ``{"moe_aux_loss", "moe_seq_aux_loss", "moe_z_loss"}`` as configured."""
    out: dict[str, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, MoE):
            for name, value in module.last_losses.items():
                out[name] = out[name] + value if name in out else value
            module.last_losses = {}
    return out


@torch.no_grad()
def update_expert_biases(model: nn.Module) -> None:
    """The auxiliary-loss-free balancing step of every router with an expert bias (call
    after each optimizer step)."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.router.update_expert_bias_(module.token_stats.groups)


def is_expert_parameter(p: torch.Tensor, util) -> bool:
    """A weight of :class:`Experts` split over the expert-parallel ranks (``libai_expert``
    under ``expert_parallel_size > 1``): its gradient is reduced over the expert-data
    group, and ZeRO leaves it whole on its rank."""
    return bool(getattr(p, "libai_expert", False)) and util.expert_parallel_size > 1


def check_expert_parallel_support(model: nn.Module, layout) -> None:
    """Raise, before any collective, when ``train.dist.expert_parallel_size`` > 1 but
    ``model`` has no Mixture-of-Experts layer to shard."""
    ep = getattr(layout, "expert_parallel_size", 1)
    if ep > 1 and not any(isinstance(m, MoE) for m in model.modules()):
        raise ValueError(
            f"train.dist.expert_parallel_size={ep}, but {type(model).__name__} has no "
            "Mixture-of-Experts layers to shard; set expert_parallel_size=1, or give the model "
            "MoE blocks (e.g. moe=dict(num_experts=8, top_k=2))"
        )


# ---- the layer ------------------------------------------------------------------------------
class MoE(nn.Module):
    """Route -> dispatch -> experts -> combine, in place of a block's :class:`MLP`: input and
    output ``[batch, seq, hidden]`` (this rank's sequence share under sequence parallel).

    ``config`` is a :class:`MoEConfig`; ``ffn_hidden_size`` the experts' size when the config
    does not give one; the activation and gating are the model's MLP's.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        config: MoEConfig,
        activation: str = "silu",
        gated: bool = True,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        *,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        self.config = c = config
        self._dist_util = util = dist.capture_mesh()
        if c.capacity_factor is not None and util.context_parallel_size > 1:
            raise ValueError(
                "moe.capacity_factor with train.dist.context_parallel_size > 1: the drop "
                "order walks each sequence in order, which context parallel's head-tail "
                "shares scatter; use dropless routing (capacity_factor=None) or cp=1"
            )
        self.layer_idx, self.sequence_parallel = layer_idx, sequence_parallel
        sp = dict(layer_idx=layer_idx, sequence_parallel=sequence_parallel)
        self.router = Router(
            hidden_size,
            c.num_experts,
            c.top_k,
            score_func=c.score_func,
            norm_topk_prob=c.norm_topk_prob,
            routed_scaling_factor=c.routed_scaling_factor,
            num_groups=c.num_groups,
            topk_groups=c.topk_groups,
            expert_bias=c.expert_bias,
            bias_update_rate=c.bias_update_rate,
            bias=c.router_bias,
            init_method=init_method,
            **sp,
        )
        self.experts = Experts(
            c.num_experts,
            hidden_size,
            c.expert_ffn_hidden_size or ffn_hidden_size,
            activation,
            gated,
            init_method,
            output_layer_init_method,
            impl=c.expert_impl,
            bias=c.ffn_bias,
            **sp,
        )
        self.shared_experts = None
        self.shared_expert_gate = None
        if c.shared_expert_ffn_hidden_size:
            self.shared_experts = MLP(
                hidden_size,
                c.shared_expert_ffn_hidden_size,
                0.0,
                activation,
                gated,
                False,
                init_method,
                output_layer_init_method,
                **sp,
            )
            if c.shared_expert_gate:
                self.shared_expert_gate = Linear(
                    hidden_size, 1, False, "data", init_method, layer_idx=layer_idx
                )
                if sequence_parallel:
                    mark_sequence_parallel(self.shared_expert_gate.weight)
        #: the ranks whose tokens the balancing statistics sum over
        self.token_stats = TokenStats(util, sequence_parallel)
        self.ep_group = util.ep_group
        #: the weighted balancing losses of the last training forward (for the log)
        self.last_losses: dict[str, torch.Tensor] = {}
        self._dropped: torch.Tensor | int = 0

    @property
    def last_dropped(self) -> int:
        """Assignments dropped over capacity in the last forward (this rank's tokens)."""
        return int(self._dropped)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, seq, width = hidden.shape
        x = hidden.reshape(-1, width)
        # route: [S(0), B] -> expert ids and weights [S(0), k]
        routing = self.router(x)
        if self.config.pad_to_capacity:
            y = self._padded_routed(x, routing, batch)
        elif torch.compiler.is_exporting():  # ONNX / torch.export: static shapes only
            return self._dense_forward(hidden, x, routing)
        else:
            y = self._routed(x, routing, batch)
        y = self._add_shared(y, hidden, x)
        if self.training and torch.is_grad_enabled():
            y = self._attach_losses(y, routing, batch)
        return y.view(batch, seq, width)

    def _routed(self, x, routing, batch) -> torch.Tensor:
        """Dropless, or capacity mode without padding: ``x [T, H]`` -> the routed experts'
        weighted sum ``[T, H]``."""
        keep = None
        if self.config.capacity_factor is not None:
            slot = self._capacity_slots(routing.experts.view(batch, -1, self.config.top_k))
            keep = (slot < self._capacity(slot.shape[1])).reshape(-1, self.config.top_k)
        # dispatch: the kept assignments sorted by expert
        perm = Permutation(routing.experts, self.config.num_experts, keep)
        self._dropped = 0 if keep is None else int(keep.numel() - perm.order.numel())
        # (index_select, not x[...]: its backward is an index_add, 3-4x the speed on a CPU of
        # indexing's accumulating index_put)
        rows = x.index_select(0, perm.tokens)
        if self.ep_group is None:
            out = self.experts(rows, perm.counts)
        else:
            # [S(0) by expert] -> all-to-all over ep -> experts -> all-to-all back
            out = exchange(rows, perm.counts, self.ep_group, self.experts)
        if keep is None:
            # combine (dropless): the rows back in token order, [T * k, H] -> [T, k, H],
            # times their weights [T, k, 1], summed over the k choices -> [T, H] (a gather:
            # backward keeps its indices, not the rows, and adds with index_add)
            rows_back = out.index_select(0, perm.inverse()).view(*routing.experts.shape, -1)
            y = (rows_back.float() * routing.weights.unsqueeze(-1)).sum(1)
            return y.to(x.dtype)
        # combine: each kept row times its weight, summed into its token
        weights = routing.weights.reshape(-1)[perm.order, None]
        out = (out.float() * weights).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, perm.tokens, out)

    def _padded_routed(self, x, routing, batch) -> torch.Tensor:
        """Capacity mode padded to static shapes (``moe.pad_to_capacity``): the same numbers
        as :meth:`_routed`. Under sequence parallel each rank's buffer has the whole
        sequence's capacity (its share's rows among them): static, but tp times the rows."""
        k = self.config.top_k
        experts = routing.experts.view(batch, -1, k)
        slot = self._capacity_slots(experts)
        capacity = self._capacity(experts.shape[1])
        slots = PaddedSlots(experts, slot, self.config.num_experts, capacity)
        if not torch.compiler.is_exporting():  # (a traced graph keeps no side state)
            self._dropped = (~slots.keep).sum()
        # dispatch: [S(0), B] -> [E, batch * capacity, H] (zeros where no token came)
        buffer = slots.gather(x)
        if self.ep_group is None:
            out = self.experts.forward_padded(buffer)
        else:
            # [E, C, H] -> all-to-all over ep (equal splits) -> experts -> all-to-all back
            out = exchange_padded(buffer, self.ep_group, self.experts.forward_padded)
        # combine: each assignment's row times its weight, summed over its k choices
        out = slots.scatter(out).float() * routing.weights.reshape(-1, 1)
        return out.to(x.dtype).view(-1, k, x.shape[1]).sum(1)

    def _dense_forward(self, hidden, x, routing) -> torch.Tensor:
        """Every expert on every token, weighted by the routing (0 for the unchosen): the
        same numbers as the routed path with no data-dependent shape, for graph export (it
        does ``E / k`` times the routed work). Dropless, one process only."""
        if self.config.capacity_factor is not None or self.ep_group is not None:
            raise ValueError(
                "exporting a Mixture-of-Experts layer needs dropless routing on one process "
                "(moe.capacity_factor=None, expert_parallel_size=1)"
            )
        weights = torch.zeros_like(routing.scores).scatter(1, routing.experts, routing.weights)
        experts = self.experts
        # [T, H] x [E, F, H] -> [T, E, F]
        up = torch.einsum("th,efh->tef", x, local_value(experts.w_up))
        if experts.b_up is not None:
            up = up + local_value(experts.b_up)
        if experts.gated:
            gate = torch.einsum("th,efh->tef", x, local_value(experts.w_gate))
            up = experts.act(gate) * up
        else:
            up = experts.act(up)
        # [T, E, F] x [E, H, F] -> [T, E, H], weighted and summed over E -> [T, H]
        out = torch.einsum("tef,ehf->teh", up, local_value(experts.w_down))
        if experts.b_down is not None:
            out = out + local_value(experts.b_down)
        y = torch.einsum("te,teh->th", weights.to(out.dtype), out)
        return self._add_shared(y, hidden, x).view(hidden.shape)

    def _add_shared(self, y, hidden, x):
        """``y [T, H]`` plus the shared experts' output (Qwen's: through its sigmoid gate)."""
        if self.shared_experts is None:
            return y
        shared = self.shared_experts(hidden).reshape(x.shape)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return y + shared

    def _capacity_slots(self, experts: torch.Tensor) -> torch.Tensor:
        """Each assignment's place in its expert's queue for its sequence (all shares of
        the sequence under sequence parallel)."""
        return capacity_slots(experts, self.config.num_experts, self.token_stats.tp_group)

    def _capacity(self, local_seq: int) -> int:
        c = self.config
        tp = 1 if self.token_stats.tp_group is None else self._dist_util.tensor_parallel_size
        return expert_capacity(c.capacity_factor, local_seq * tp, c.top_k, c.num_experts)

    def _attach_losses(self, y: torch.Tensor, routing, batch: int) -> torch.Tensor:
        c, stats = self.config, self.token_stats
        terms = {}
        if c.aux_loss_coeff:
            terms["moe_aux_loss"] = c.aux_loss_coeff * load_balancing_loss(routing, c.top_k, stats)
        if c.seq_aux_loss_coeff:
            seq_aux = sequence_load_balancing_loss(routing, c.top_k, batch, stats)
            terms["moe_seq_aux_loss"] = c.seq_aux_loss_coeff * seq_aux
        if c.z_loss_coeff:
            terms["moe_z_loss"] = c.z_loss_coeff * router_z_loss(routing, stats)
        self.last_losses = {k: v.detach() for k, v in terms.items()}
        if not terms:
            return y
        return _AttachLoss.apply(y, sum(terms.values()))

    def extra_repr(self) -> str:
        c = self.config
        mode = "dropless" if c.capacity_factor is None else f"capacity_factor={c.capacity_factor}"
        return f"layer_idx={self.layer_idx}, {mode}"
