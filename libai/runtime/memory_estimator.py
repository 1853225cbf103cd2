"""Per-rank training memory of a LiBai config, without processes or collectives.

:func:`estimate_memory` answers "how many bytes does each rank of this layout hold" for
parameters, gradients, optimizer state and activations, so a user can pick a layout before
launching it (``tools/estimate_memory.py``).

**Parameters are counted, not re-derived.** For each (pipeline rank, tensor-parallel rank)
the model is built from the config on the ``meta`` device under a *counting* mesh (a
:class:`~libai.dist.DistUtil` that holds this rank's coordinates but no process
group): every layer creates exactly the tp shard and pipeline stage it would create in
training (vocab padding, custom stage ids, the tied LM-head copy on the last stage), and
:func:`~libai.runtime.pipeline_split.prune_to_stages` drops the other stages. Tied tensors are
counted once.

**ZeRO** then splits these local tensors over the data-parallel ranks, with the same rules
as :mod:`libai.runtime.zero`:

- stage 1/2: parameter ``i`` belongs to dp rank ``owner[i]`` of
  :func:`~libai.runtime.zero.partition_parameters` (greedy by element count); a rank keeps
  the optimizer state (stage 1) and also the gradients (stage 2) of what it owns;
- stage 3 (FSDP2): every local tensor is split along dim 0 over the shard group of
  ``g = dp / hsdp_replicate_size`` ranks like ``torch.chunk``: rank ``r`` holds rows
  ``[r*c, min((r+1)*c, d0))`` with ``c = ceil(d0 / g)``.

**Bytes per rank** (``P`` = parameter elements this rank holds, ``P_opt`` / ``P_grad`` the
elements it keeps optimizer state / gradients for, ``n_opt`` their tensor count):

- parameters: ``4 P`` (fp32 master weights, also under AMP level O1);
- gradients: ``4 P_grad`` (fp32: autocast's gradients land on the fp32 weights), as held
  after the step's gradient sync (ZeRO-2 holds every gradient until its reduce);
- optimizer: AdamW/Adam ``8 P_opt + 4 n_opt`` (``exp_avg``, ``exp_avg_sq`` and a float32
  ``step`` per tensor); SGD with momentum ``4 P_opt``; plain SGD ``0``;
- mixed precision O2 (``train.amp.level="O2"``): parameters ``2 P`` and gradients
  ``2 P_grad`` (normalization parameters, which stay fp32, are counted at 2 bytes too: a
  tiny share), and the optimizer also holds the fp32 masters of what it steps, ``4 P_opt``;
  no low-precision weight copies among the activations.

**Activations** (saved for backward, per micro-batch of ``b`` sequences of ``s`` tokens,
``h`` hidden, ``f`` ffn, ``a`` heads, ``t`` tp size, ``e`` compute bytes: 4, or 2 under
AMP; the residual stream and norm inputs stay fp32) of a pre-norm block, per token:

- no checkpointing: ``4 * 2h / q`` (the two norm inputs; ``q = t`` with sequence parallel,
  else 1) ``+ e * 2h`` (the two column-parallel inputs, gathered under sequence parallel;
  under AMP a gated MLP's gate and up layers each keep their own cast copy: ``e * 3h``)
  ``+ e * (w_qkv + h_attn + w_fc1 + k * f) / t`` (q/k/v, the attention output, the MLP up
  projection(s) and the activation output(s): ``k`` = 1, or 2 for a gated MLP)
  ``+ 2 n / q + 4a / t`` (``n`` per norm: LayerNorm's mean and rstd, 8 bytes; RMSNorm's
  rstd and normalized input, ``4 + 4h``; the attention log-sum-exp)
  ``+ e * (w_q + w_kv) / t`` with rotary positions (the rotated q and k), plus under AMP the
  low-precision copies of the block's matmul weights (``2 * W_local`` bytes);
- full checkpointing: ``4h / q`` (the block input) plus the RNG state the checkpoint keeps
  (:data:`RNG_STATE_BYTES` per block);
- "full_attn" / "core_attn" (FleetX's granularities) are not modelled: the estimate is
  the no-checkpointing bound above them;
- selective (every attention output and every second matmul output kept):
  ``4h / q + e * (w_qkv + h_attn + w_fc1) / t + 4a / t`` plus the RNG state.

Outside the blocks: the final norm's input (``4h / q``) and the LM head's input
(``e h``); the loss keeps the fp32 (log-)softmax of the ``[b s, V / t]`` logits (``4`` bytes
each; under AMP also the head weight's low-precision copy, ``2 V h / t``), or with
``model.cfg.loss_chunk_size`` only a fp32 log-normalizer per token (``4`` bytes). A later
pipeline stage also keeps the activation it received (``4h / q``). Dropout with ``p > 0``
keeps its noise tensor (``e`` bytes per element it touches; ``4`` after the fp32
embedding), and attention dropout makes attention take the math path, which keeps the
probabilities, the noise and the dropped probabilities (``3 e a s / t`` per token instead of
the log-sum-exp).

A Mixture-of-Experts block counts its attention half as above and its routed half by
:mod:`libai.runtime.memory_moe` (dropless, capacity, padded; shared experts); selective
checkpointing of MoE blocks is not modelled (refused).

Checked against the bytes a forward really keeps
(tests/unit/runtime/test_memory_estimator.py, within 1%): GPT-2 fp32 and bf16 AMP, full and
selective checkpointing, the chunked loss, dropout, tp2 with and without sequence parallel;
Llama with grouped kv heads, fp32 and bf16; Llama MoE blocks (see memory_moe). Not checked by a
measurement: activations under pp (the in-flight counts are Megatron's), AMP combined with
sequence parallel, ZeRO-3 + AMP (FSDP's gathered
low-precision weights are counted like autocast's copies).

**In flight** (what the schedule keeps at its peak, in micro-batches): 1 without pipeline;
GPipe / LoopedBFS ``m`` (the number of micro-batches); 1F1B and the zero-bubble schedules
``min(p - k, m)`` on pipeline rank ``k``; interleaved (``v`` chunks)
``min(m v, 2 (p - k - 1) + (v - 1) p + 1)`` chunk-micro-batches of ``1/v`` of the rank's
activations (Megatron's warm-up count plus one).

Not in the totals: transient buffers (ZeRO-3's all-gathered block weights, ZeRO-2's full
gradients during backward, communication buckets) and the allocator's fragmentation.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from libai import dist
from libai.layers.moe import is_expert_parameter
from libai.runtime.memory_moe import moe_activation_bytes, moe_geometry

#: bytes of the CPU RNG state that a non-reentrant checkpoint keeps per block
RNG_STATE_BYTES = 5056
_FP32 = 4
_LONG_SCHEDULES = ("GPipe", "LoopedBFS")


@dataclass(frozen=True)
class TrainSettings:
    """What decides memory, resolved: the run spec's switches
    (:class:`~libai.runtime.spec.RunSpec`, through its resolvers in :func:`estimate_config`),
    the batch sizes, the sequence length and the optimizer kind."""

    micro_batch_size: int
    seq_length: int
    num_microbatches: int = 1
    zero_stage: int | None = None
    hsdp_replicate_size: int = 1
    amp_dtype: torch.dtype | None = None
    #: mixed precision O2: low-precision parameters and gradients, fp32 masters
    master_weights: bool = False
    checkpointing: str | None = None  # None, "full" or "selective"
    optimizer: str = "adamw"  # "adamw", "sgd" or "sgd_momentum"
    loss_chunk_size: int | None = None
    #: False: parameters, gradients and optimizer state only (any model)
    activations: bool = True


@dataclass
class RankMemory:
    """One rank's bytes (see the module doc for what each holds)."""

    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    parameters: int
    gradients: int
    optimizer: int
    activations_micro_batch: int
    in_flight: int
    #: context-parallel rank (its peers hold the same bytes)
    cp_rank: int = 0
    activations: int = field(init=False)

    def __post_init__(self):
        self.activations = int(self.activations_micro_batch * self.in_flight)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


# ---- counting the model ----------------------------------------------------------------------
class CountingDistUtil(dist.DistUtil):
    """A mesh answer for one rank's coordinates with no process group: parameters come out
    as plain ``meta`` tensors of the rank's local (tp-shard, own-stage) shapes."""

    def __init__(
        self,
        layout: dist.DistLayout,
        pp_rank: int,
        dp_rank: int = 0,
        tp_rank: int = 0,
        cp_rank: int = 0,
    ):
        self.layout, self.mesh = layout, None
        self.pipeline_rank, self.data_parallel_rank, self.tensor_parallel_rank = (
            pp_rank,
            dp_rank,
            tp_rank,
        )
        dp, cp, tp = (
            layout.data_parallel_size,
            layout.context_parallel_size,
            layout.tensor_parallel_size,
        )
        self.rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
        self.device = torch.device("meta")
        self.stage_dims, self.stage_mesh = (), None  # plain local tensors
        self.context_parallel_rank = cp_rank
        self.tp_group = self.dp_group = self.pp_group = self.embedding_group = None
        self.cp_group = self.grad_group = None
        self.grad_size = dp * cp
        # expert parallel: this rank holds experts [r * E / ep, (r + 1) * E / ep), r its ep
        # coordinate (neighbouring dp x cp ranks form an ep group)
        self.expert_parallel_rank = (dp_rank * cp + cp_rank) % layout.expert_parallel_size
        self.expert_mesh, self.expert_dims = None, ()
        self.ep_group = self.expert_grad_group = None


@contextlib.contextmanager
def counting_mesh(util: CountingDistUtil):
    """Make ``util`` the current mesh (restoring the previous one after)."""
    with dist.use_dist_util(util):
        yield util


def build_stage_model(model_cfg, util: CountingDistUtil) -> nn.Module:
    """The model of ``util``'s rank, on ``meta``: its pipeline stages only, its tp shards."""
    from libai.config import instantiate
    from libai.layers.param import skip_init
    from libai.runtime.pipeline_split import prune_to_stages

    with counting_mesh(util), torch.random.fork_rng(devices=[]), skip_init():
        model = instantiate(model_cfg)
        if util.layout.pipeline_parallel_size > 1:
            prune_to_stages(model, set(util.local_stages()))
    return model


def unique_parameters(model: nn.Module, optim_cfg=None) -> list[torch.Tensor]:
    """Trainable parameters, each tensor once (a tied head shares the embedding's), in the
    order of ``cfg.optim``'s param groups when given (ZeRO 1/2 partition in that order),
    else in the model's order."""
    params = model.parameters()
    if optim_cfg is not None:
        from libai.optim import build_optimizer

        optimizer = build_optimizer(optim_cfg, model)  # meta tensors: no state is created
        params = [p for g in optimizer.param_groups for p in g["params"]]
    seen, out = set(), []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


# ---- ZeRO -------------------------------------------------------------------------------------
def fsdp_shard_numel(shape: tuple[int, ...], shard_size: int, shard_rank: int) -> int:
    """Elements of ``torch.chunk(x, shard_size, dim=0)[shard_rank]`` (FSDP2's dim-0 shard)."""
    if not shape:
        return 1 if shard_rank == 0 else 0
    rows = math.ceil(shape[0] / shard_size)
    mine = max(0, min(rows, shape[0] - shard_rank * rows))
    return mine * math.prod(shape[1:])


def held_numels(shapes, settings: TrainSettings, dp: int, dp_rank: int, experts=()) -> tuple:
    """``(parameter, gradient, optimizer)`` element lists this dp rank holds of a (pp, tp)
    position's local parameter ``shapes`` under ``settings.zero_stage``; ``experts``: the
    shapes of the rank's expert-parallel expert weights, which ZeRO leaves whole (each rank
    keeps their gradients and state)."""
    from libai.runtime.zero import partition_parameters

    numels = [math.prod(s) for s in shapes]
    own = [math.prod(s) for s in experts]
    stage = settings.zero_stage
    if stage is None:
        return numels + own, numels + own, numels + own
    if stage == 3:
        group = dp // settings.hsdp_replicate_size
        local = [fsdp_shard_numel(tuple(s), group, dp_rank % group) for s in shapes]
        return local + own, local + own, local + own
    owners = partition_parameters(numels, dp)
    owned = [n for n, r in zip(numels, owners) if r == dp_rank]
    return numels + own, (owned if stage == 2 else numels) + own, owned + own


def optimizer_bytes(numels: list[int], optimizer: str) -> int:
    """State bytes of ``optimizer`` over fp32 tensors of ``numels`` elements."""
    if optimizer == "adamw":
        return sum(2 * _FP32 * n + _FP32 for n in numels)
    if optimizer == "sgd_momentum":
        return sum(_FP32 * n for n in numels)
    if optimizer == "sgd":
        return 0
    raise ValueError(f"unknown optimizer kind {optimizer!r} (adamw, sgd, sgd_momentum)")


# ---- activations ------------------------------------------------------------------------------
def _block_geometry(block: nn.Module) -> dict:
    """Full widths of a TransformerLayer's matmuls and its local matmul-weight elements (a
    Mixture-of-Experts block: its MoE's own geometry, :mod:`libai.runtime.memory_moe`)."""
    from libai.layers import MoE

    attn, mlp = block.self_attention, block.mlp
    moe = moe_geometry(mlp) if isinstance(mlp, MoE) else None
    return {
        "hidden": attn.hidden_size,
        "heads": attn.num_heads,
        "qkv": attn.query_key_value.out_features,
        "attn_out": attn.dense.in_features,
        "ffn": 0 if moe else mlp.dense_4h_to_h.in_features,
        "up": 0 if moe else mlp.dense_h_to_4h.out_features * (2 if mlp.gated else 1),
        "act_outputs": 0 if moe else 2 if mlp.gated else 1,
        "moe": moe,
        "rms_norm": _is_rms(block.input_layernorm),
        "weight_numel": sum(m.weight.numel() for m in block.modules() if hasattr(m, "in_features")),
        "hidden_dropout": sum(
            m.p > 0
            for m in (attn.output_dropout, getattr(mlp, "dropout", None))
            if isinstance(m, nn.Dropout)
        ),
        "attention_dropout": attn.attention_dropout_prob > 0,
    }


def _is_rms(norm: nn.Module | None) -> bool:
    return norm is not None and "RMS" in type(norm).__name__


def _norm_extra(rms: bool, h: int) -> int:
    """Per-token bytes a norm keeps besides its input: LayerNorm's fp32 mean and rstd (8);
    RMSNorm's fp32 rstd and its normalized input (4 + 4h, not fused)."""
    return 4 + _FP32 * h if rms else 8


def block_activation_bytes(
    geo: dict, tokens: int, tp: int, sp: bool, settings, rotary: bool = False
) -> int:
    """Bytes one block keeps for backward for ``tokens`` tokens (module doc formulas);
    ``rotary``: the model rotates q and k (the rotated copies are kept)."""
    h, q = geo["hidden"], (tp if sp else 1)
    e = 2 if settings.amp_dtype is not None else _FP32
    block_input = _FP32 * h / q
    lse = _FP32 * geo["heads"] / tp
    if geo["attention_dropout"]:  # the math path: probabilities, noise, dropped probabilities
        lse = 3 * e * geo["heads"] / tp * settings.seq_length
    kept = e * (geo["qkv"] + geo["attn_out"] + geo["up"]) / tp
    mode = settings.checkpointing
    if mode in ("full_attn", "core_attn"):
        mode = None  # FleetX's partial granularities: bounded above by no checkpointing
    if mode == "full":
        return int(tokens * block_input) + RNG_STATE_BYTES
    moe = geo.get("moe")
    # the MLP's input: under AMP each of its column-parallel layers keeps its own cast copy
    mlp_inputs = 0 if moe else geo["act_outputs"] if settings.amp_dtype is not None else 1
    if mode == "selective":
        if moe is not None:
            raise ValueError(
                "the activation formulas do not model selective checkpointing of "
                "Mixture-of-Experts blocks: estimate with full or no checkpointing, or "
                "parameters, gradients and optimizer state only (--no-activations)"
            )
        return int(tokens * (block_input + kept + lse)) + RNG_STATE_BYTES
    per_token = (
        2 * block_input
        + e * (1 + mlp_inputs) * h  # the column-parallel inputs (MoE: the router's, below)
        + kept
        + e * geo["act_outputs"] * geo["ffn"] / tp
        + _norm_extra(geo["rms_norm"], h) * 2 / q
        + rotary * e * (geo["attn_out"] + (geo["qkv"] - geo["attn_out"]) / 2) / tp
        + lse
        + geo["hidden_dropout"] * e * h / q  # dropout noise
    )
    cast_copies = settings.amp_dtype is not None and not settings.master_weights
    weights = 2 * geo["weight_numel"] if cast_copies else 0
    routed = moe_activation_bytes(moe, h, tokens, settings, tp, sp) if moe else 0
    return int(tokens * per_token) + weights + routed


def gathered_kv_bytes(geo: dict, settings: TrainSettings, cp: int, tp: int, e: int) -> int:
    """Context parallel: the keys and values of the whole sequence that a block's attention
    gathers and keeps for backward. A share's two query chunks read the keys up to their own
    ends (:func:`~libai.layers.context_parallel.causal_share_attention`), chunk ``r`` and
    chunk ``2 cp - 1 - r`` of ``2 cp``: ``(2 cp + 1) / (2 cp)`` of the sequence's keys and
    values on every rank."""
    kv_width = (geo["qkv"] - geo["attn_out"]) // tp  # keys + values per token, this rank
    tokens = settings.micro_batch_size * settings.seq_length
    return int(tokens * kv_width * e * (2 * cp + 1) / (2 * cp))


def stage_activation_bytes(model, util: CountingDistUtil, settings: TrainSettings) -> int:
    """Bytes a rank keeps for one micro-batch through its pipeline stage(s)."""
    from libai.layers import TransformerLayer

    layout = util.layout
    tp, sp = layout.tensor_parallel_size, layout.sequence_parallel
    q = tp if sp else 1
    # context parallel: a rank's share of each sequence (its keys and values come on top)
    tokens = settings.micro_batch_size * settings.seq_length // layout.context_parallel_size
    if not settings.activations:
        return 0
    blocks = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    unsupported = [
        b for b in blocks if not b.pre_norm or getattr(b, "cross_attention", None) is not None
    ]
    if not blocks or unsupported:
        raise ValueError(
            f"the activation formulas cover pre-norm decoder-only blocks (GPT-2, Llama/Qwen2); "
            f"{type(model).__name__} has "
            + ("no TransformerLayer" if not blocks else "post-norm or cross-attention blocks")
            + ": estimate parameters, gradients and optimizer state only (--no-activations)"
        )
    rotary = any("Rotary" in type(m).__name__ for m in model.modules())
    total = sum(
        block_activation_bytes(_block_geometry(b), tokens, tp, sp, settings, rotary) for b in blocks
    )
    h = _block_geometry(blocks[0])["hidden"]
    e = 2 if settings.amp_dtype is not None else _FP32
    cp = layout.context_parallel_size
    if cp > 1:
        total += sum(gathered_kv_bytes(_block_geometry(b), settings, cp, tp, e) for b in blocks)
    stages = util.local_stages() if layout.pipeline_parallel_size > 1 else [0]
    total += sum(s != 0 for s in stages) * tokens * _FP32 * h // q  # received activations
    in_blocks = {id(m) for b in blocks for m in b.modules()}
    other_dropouts = [
        m
        for m in model.modules()
        if isinstance(m, nn.Dropout) and m.p > 0 and id(m) not in in_blocks
    ]
    total += len(other_dropouts) * tokens * _FP32 * h // q  # embedding dropout noise
    if layout.num_stages - 1 in stages:
        final_rms = any(_is_rms(m) for m in model.modules() if id(m) not in in_blocks)
        # final norm input (+ stats), head input
        total += tokens * (_FP32 * h // q + _norm_extra(final_rms, h) // q + e * h)
        if settings.loss_chunk_size:
            total += tokens * _FP32  # the fp32 log-normalizer
        else:
            vocab = _head_vocab_local(model) // tp
            total += tokens * vocab * _FP32  # the fp32 (log-)softmax
            if settings.amp_dtype is not None and not settings.master_weights:
                total += 2 * vocab * h  # the head weight's low-precision copy
    return int(total)


def _head_vocab_local(model: nn.Module) -> int:
    from libai.layers import LMLogits

    heads = [m for m in model.modules() if isinstance(m, LMLogits)]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no LMLogits head to estimate logits")
    return heads[0].padded_vocab_size


def in_flight_micro_batches(layout: dist.DistLayout, pp_rank: int, m: int) -> float:
    """Micro-batches of a rank's activations the schedule keeps at its peak (module doc)."""
    p, v = layout.pipeline_parallel_size, layout.virtual_pipeline_size
    if p == 1:
        return 1
    if layout.pipeline_schedule in _LONG_SCHEDULES:
        return m
    if v > 1:
        return min(m * v, 2 * (p - pp_rank - 1) + (v - 1) * p + 1) / v
    return min(p - pp_rank, m)


# ---- the estimate -----------------------------------------------------------------------------
def estimate_memory(model_cfg, layout: dist.DistLayout, settings: TrainSettings, optim_cfg=None):
    """One :class:`RankMemory` per rank of ``layout`` (rank order of the ``(pp, dp, cp, tp)``
    mesh). Builds the model once per (pp, tp) position on ``meta``; ``optim_cfg``
    (``cfg.optim``) orders the parameters as the trainer's optimizer does."""
    dp, tp = layout.data_parallel_size, layout.tensor_parallel_size
    cp = layout.context_parallel_size
    rows = []
    for pp_rank, tp_rank in itertools.product(range(layout.pipeline_parallel_size), range(tp)):
        # context-parallel peers hold the same parameters and the same share of activations
        util = CountingDistUtil(layout, pp_rank, 0, tp_rank)
        model = build_stage_model(model_cfg, util)
        with counting_mesh(util):
            params = unique_parameters(model, optim_cfg)
        expert = [is_expert_parameter(p, util) for p in params]
        shapes = [tuple(p.shape) for p, e in zip(params, expert) if not e]
        experts = [tuple(p.shape) for p, e in zip(params, expert) if e]
        act = stage_activation_bytes(model, util, settings)
        flight = in_flight_micro_batches(layout, pp_rank, settings.num_microbatches)
        for dp_rank, cp_rank in itertools.product(range(dp), range(cp)):
            # ZeRO 1/2 shard over the dp x cp ranks (ordered (dp, cp))
            params, grads, opt = held_numels(
                shapes, settings, dp * cp, dp_rank * cp + cp_rank, experts
            )
            # O2: 2-byte parameters and gradients, fp32 masters of what the rank steps
            width = 2 if settings.master_weights else _FP32
            masters = _FP32 * sum(opt) if settings.master_weights else 0
            rows.append(
                RankMemory(
                    rank=((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank,
                    pp_rank=pp_rank,
                    dp_rank=dp_rank,
                    tp_rank=tp_rank,
                    cp_rank=cp_rank,
                    parameters=width * sum(params),
                    gradients=width * sum(grads),
                    optimizer=optimizer_bytes(opt, settings.optimizer) + masters,
                    activations_micro_batch=act,
                    in_flight=flight,
                )
            )
    return sorted(rows, key=lambda r: r.rank)


# ---- from a LiBai config ----------------------------------------------------------------------
def optimizer_kind(optim_cfg) -> str:
    """``"adamw"``, ``"sgd"`` or ``"sgd_momentum"`` for ``cfg.optim``; raises otherwise."""
    from libai.config.instantiate import locate

    target = optim_cfg.get("_target_")
    target = locate(target) if isinstance(target, str) else target
    name = getattr(target, "__name__", str(target))
    if name in ("AdamW", "Adam"):
        return "adamw"
    if name == "SGD":
        return "sgd_momentum" if (optim_cfg.get("momentum") or 0) > 0 else "sgd"
    raise ValueError(f"the memory estimator knows AdamW, Adam and SGD, not optim={name}")


def estimate_config(
    cfg, world_size: int | None = None, seq_length: int | None = None, activations: bool = True
):
    """``(layout, settings, rows)`` for a loaded LiBai config (overrides applied).

    ``world_size`` defaults to ``data_parallel_size (or 1) x tp x pp`` of ``train.dist``;
    ``seq_length`` to ``model.cfg.max_seq_length`` (or ``max_position_embeddings``);
    ``activations=False`` leaves activations out (models the formulas do not cover). The vocab is padded as the trainer pads
    it (the tokenizer's ``padded_vocab_size`` unless ``tokenization.setup=False``). Raises
    ``ValueError`` for what training would reject (sizes that do not divide, a ZeRO stage
    the layout cannot use, an unknown switch value).
    """
    from libai.config import resolve_batch_sizes, try_get_key
    from libai.runtime.run_config import (
        build_run_tokenizer,
        fill_pipeline_num_layers,
        sizes_vocab_from_tokenizer,
    )
    from libai.runtime.spec import RunSpec

    train = cfg.train
    fill_pipeline_num_layers(cfg)
    spec = RunSpec.from_config(train)  # the trainer's schema and switch resolvers
    if world_size is None:
        d = train.dist
        world_size = (
            (d.get("data_parallel_size") or 1)
            * (d.get("tensor_parallel_size") or 1)
            * (d.get("pipeline_parallel_size") or 1)
        )
    layout = dist.resolve_layout(train.dist, int(world_size))
    batches = resolve_batch_sizes(train, layout.data_parallel_size)
    seq_length = seq_length or try_get_key(cfg, "model.cfg.max_seq_length")
    seq_length = seq_length or try_get_key(cfg, "model.cfg.max_position_embeddings")
    if activations and not seq_length:
        raise ValueError("the config names no model.cfg.max_seq_length: pass --seq-length")
    settings = TrainSettings(
        micro_batch_size=batches.train_micro_batch_size,
        seq_length=int(seq_length or 0),
        num_microbatches=batches.num_accumulation_steps,
        zero_stage=spec.zero_stage(layout),
        hsdp_replicate_size=int(spec.zero_optimization.hsdp_replicate_size or 1),
        amp_dtype=spec.amp_dtype(),
        master_weights=spec.amp.master_weights(),
        checkpointing=spec.checkpointing(),
        optimizer=optimizer_kind(cfg.optim),
        loss_chunk_size=try_get_key(cfg, "model.cfg.loss_chunk_size"),
        activations=activations,
    )
    if sizes_vocab_from_tokenizer(cfg):
        with counting_mesh(CountingDistUtil(layout, 0)):
            build_run_tokenizer(cfg)  # pads model.cfg.vocab_size as training does
    return layout, settings, estimate_memory(cfg.model, layout, settings, cfg.optim)
