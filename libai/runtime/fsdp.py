"""ZeRO stage 3: FSDP2 ``fully_shard`` over the data-parallel dim of any dp x tp x pp mesh.

The order is torchtitan's: the model already holds its tensor-parallel shards (DTensors on
the stage's (dp, tp) mesh, ``[B, S(k)]`` or ``[B, B]``), activation checkpointing and compile
were applied by the :class:`~libai.runtime.parallel.ModelRunner`, and the pipeline stage was
cut out. Then, per pipeline stage of this rank:

1. every parameter drops its (replicated) dp dim: a DTensor on the ``tp`` sub-mesh with its
   tp placement (a plain tensor when tp = 1) -- FSDP2 adds the dp dim back as its own;
2. ``fully_shard`` each block (:func:`~libai.runtime.blocks.model_blocks`; a block holding
   a weight tied to the root's, as a Hugging Face embedding tied to the LM head, is left to
   the root: :func:`blocks_tied_to_root_merged`), then the stage root, on the dp mesh: ``[S(0)]`` over dp for a plain parameter, ``[S(0), S(k)]`` over
   (dp, tp) for a tp-sharded one (``_StridedShard`` when both split dim 0);
3. with HSDP (``hsdp_replicate_size = r > 1``) the dp dim is unflattened into
   ``(dp_replicate=r, dp_shard=dp/r)``: parameters are sharded within a group of dp/r ranks
   and replicated across the r groups (``[R, S(0), ...]``);
4. with AMP, ``MixedPrecisionPolicy(param_dtype=amp dtype, reduce_dtype=float32)``: blocks
   compute on all-gathered low-precision weights, gradients are reduced in fp32 into fp32
   shards.

Under pipeline parallel the stage root is the module a ``PipelineStage`` runs, so the
schedule drives FSDP itself: no gradient reduce-scatter per micro-batch, one after the last
(``perform_reduce_grad``), and ``reshard_after_forward=False`` keeps the gathered weights
between a micro-batch's forward and backward (torchtitan's choice) instead of all-gathering
them again for every micro-batch. With an interleaved schedule each of the rank's stages
(structural copies of the model sharing its parameters) is its own FSDP root, and the
model is given the copies' sharded parameters (:func:`_share_back`).

FSDP2 gathers a module's own parameters in hooks of ``module.__call__``. Code that runs a
root's method other than ``forward`` (``ModelRunner.predict`` runs ``pipeline_forward``
without pp) goes through :func:`fsdp_forward_method`, or it would find the parameters held
by the root outside every block (embeddings, final norm, head) still sharded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from libai.layers.moe import is_expert_parameter

__all__ = [
    "FullyShardedGrads",
    "apply_fully_shard",
    "blocks_tied_to_root_merged",
    "check_fsdp_units",
    "fsdp_forward_method",
    "fsdp_mesh",
]

#: the config key of HSDP's replicate size (named in errors)
HSDP_KEY = "train.zero_optimization.hsdp_replicate_size"


class FullyShardedGrads:
    """Stage 3's place in ``ModelRunner.grads.sharder``: FSDP2 reduce-scatters the gradients
    over dp in backward, so the runner's dp sync has nothing left to do. Each rank of a shard
    group holds a disjoint piece of every gradient: clipping sums the norm terms over
    ``norm_group`` (the shard group; HSDP's replicas hold the same pieces)."""

    def __init__(self, norm_group):
        self.norm_group = norm_group

    def reduce_gradients(self) -> None:
        pass


def fsdp_forward_method(module: nn.Module, name: str):
    """``module.<name>`` (e.g. ``pipeline_forward``), callable on an FSDP2 root as FSDP2 runs
    ``module.forward``: its pre-forward gathers the root's own parameters, its post-forward
    frees them again (``reshard_after_forward``) and, the first time, makes the module the
    root of its blocks. The plain method when ``module`` is not an FSDP2 module.

    A direct call of a method skips those hooks, and the root's parameters would still be
    sharded. FSDP2's :func:`~torch.distributed.fsdp.register_fsdp_forward_method` wraps a
    method in them; it wraps a copy kept under its own attribute, because ``forward`` itself
    often calls ``pipeline_forward``, whose hooks would then run a second time, nested, in
    every training step."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if not isinstance(module, FSDPModule):
        return getattr(module, name)
    hooked = f"_libai_fsdp_{name}"
    if hooked not in module.__dict__:
        module.__dict__[hooked] = getattr(module, name)
        register_fsdp_forward_method(module, hooked)  # replaces it by the wrapped method
    return module.__dict__[hooked]


def fsdp_mesh(util, replicate_size: int = 1) -> DeviceMesh:
    """The mesh FSDP2 shards over: the ``dp`` dim of the global mesh; under context parallel
    the ``dp`` and ``cp`` dims flattened into one ``dp_cp`` dim (the ranks that hold the same
    parameters, as torchtitan's ``dp_shard_cp``); with HSDP the ``dp`` dim unflattened into
    ``("dp_replicate", "dp_shard")``. A collective: creates process groups."""
    if util.layout.context_parallel_size > 1:
        # [S(0)] over dp x cp: each of the dp x cp ranks holds 1 / (dp cp) of every tensor,
        # and the reduce-scatter averages the gradients over them (the runner's dp x cp mean)
        return util.mesh["dp", "cp"]._flatten("dp_cp")
    dp_mesh = util.mesh["dp"]
    if replicate_size == 1:
        return dp_mesh
    shard_size = util.layout.data_parallel_size // replicate_size
    return dp_mesh._unflatten(0, (replicate_size, shard_size), ("dp_replicate", "dp_shard"))


def _units(roots: Iterable[nn.Module]) -> list[tuple[nn.Module, list[nn.Module]]]:
    from libai.runtime.blocks import model_blocks

    return [(root, blocks_tied_to_root_merged(root, model_blocks(root))) for root in roots]


def blocks_tied_to_root_merged(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """``blocks`` without those that share a parameter with the root (tied weights: every
    Hugging Face LM head ties the word embedding of an embedding block): their parameters
    join the root's unit, as FSDP2 users wrap tied weights. Repeated until no kept block
    shares one with the grown root; logs each merged block. Blocks sharing a parameter with
    each other stay (:func:`check_fsdp_units` names them)."""
    import logging

    names = {id(m): n for n, m in model.named_modules()}
    param_names: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(p), n)
    kept = list(blocks)
    while True:
        root = {id(p) for p in _root_parameters(model, kept)}
        tied = [b for b in kept if any(id(p) in root for p in b.parameters())]
        if not tied:
            return kept
        for block in tied:
            shared = next(p for p in block.parameters() if id(p) in root)
            logging.getLogger(__name__).info(
                "ZeRO-3: block %s shares %s with the model root (tied weights); its parameters "
                "are sharded in the root's unit",
                names.get(id(block), type(block).__name__),
                param_names.get(id(shared), "?"),
            )
        kept = [b for b in kept if all(b is not t for t in tied)]


def check_fsdp_units(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Raise ``ValueError`` (naming the parameter and the fix) unless FSDP2 can wrap ``model``
    with one unit per block plus the root: it needs parameters, and every parameter must
    belong to exactly one unit (a parameter shared by two blocks, or by a block and the
    root, would be sharded twice). Runs no collective."""
    switch = "train.zero_optimization.stage=3"
    if next(model.parameters(), None) is None:
        raise ValueError(
            f"{switch}: {type(model).__name__} has no parameters on this rank to shard; "
            "disable train.zero_optimization or use stage 1/2"
        )
    owner: dict[int, str] = {}
    names: dict[int, str] = {}  # each parameter's first name
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)
    block_names = {id(m): n for n, m in model.named_modules()}
    in_blocks: set[int] = set()
    for block in blocks:
        for p in block.parameters():
            unit = block_names.get(id(block), type(block).__name__)
            if id(p) in owner and owner[id(p)] != unit:
                raise ValueError(
                    f"{switch}: parameter {names.get(id(p), '?')} is shared by blocks "
                    f"{owner[id(p)]} and {unit}; FSDP2 shards each block on its own and cannot "
                    "shard one parameter twice. Untie it, keep shared weights outside the "
                    "blocks (on the model root), or use stage 1/2"
                )
            owner[id(p)] = unit
            in_blocks.add(id(p))
    root_params = {id(p) for p in _root_parameters(model, blocks)}
    shared = root_params & in_blocks
    if shared:
        name = names.get(next(iter(shared)), "?")
        raise ValueError(
            f"{switch}: parameter {name} is used by block {owner[next(iter(shared))]} and "
            "outside the blocks; FSDP2 cannot shard one parameter in two units. Untie it, "
            "keep it on the model root only, or use stage 1/2"
        )


def _root_parameters(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Parameter]:
    """The parameters of ``model`` held by modules outside every block."""
    inside = {id(m) for b in blocks for m in b.modules()}
    return [p for m in model.modules() if id(m) not in inside for p in m.parameters(recurse=False)]


def _libai_attributes(p: torch.Tensor) -> dict:
    return {k: v for k, v in p.__dict__.items() if k.startswith("libai_")}


def _drop_dp_dim(model: nn.Module, util) -> None:
    """Replace each DTensor parameter on the stage's (dp, tp) mesh (replicated over dp) by the
    same local shard on the ``tp`` sub-mesh (a plain tensor when tp = 1). Sharing between
    modules and ``libai_*`` attributes are kept."""
    tp_dim = util.stage_dims.index("tp") if "tp" in util.stage_dims else None
    replaced: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if not isinstance(p, DTensor) or is_expert_parameter(p, util):
                continue
            if id(p) not in replaced:
                local = p.to_local().detach()
                if tp_dim is None:
                    value = local.clone()
                else:  # [B, S(k)] on (dp, tp) -> [S(k)] on tp: same local shard
                    value = DTensor.from_local(
                        local.clone(),
                        util.mesh["tp"],
                        [p.placements[tp_dim]],
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )
                new = nn.Parameter(value, requires_grad=p.requires_grad)
                new.__dict__.update(_libai_attributes(p))
                replaced[id(p)] = new
            setattr(module, name, replaced[id(p)])


def _share_back(runner) -> None:
    """Interleaved schedules: a rank's stages are structural copies of ``runner.model`` that
    shared its parameter objects, and FSDP2 registered new (sharded) ones on the copies. Give
    ``runner.model`` those: the optimizer, clipping and checkpoints see the shards. (FSDP2
    swaps gathered weights in and out on the copies only; nothing runs ``runner.model``
    itself under pp.)"""
    for stage_model in runner.stage_schedule.stage_models:
        for path, module in stage_model.named_modules():
            target = runner.model.get_submodule(path)
            for name, p in module.named_parameters(recurse=False):
                setattr(target, name, p)


def _check_disjoint(units) -> None:
    """Each parameter in one stage root only (a rank's interleaved stages are separate FSDP
    roots)."""
    seen: dict[int, int] = {}
    for index, (root, _) in enumerate(units):
        for name, p in root.named_parameters():
            if seen.setdefault(id(p), index) != index:
                raise ValueError(
                    f"train.zero_optimization.stage=3: parameter {name} is used by two pipeline "
                    f"stages of this rank ({seen[id(p)]} and {index} of its local stages); "
                    "FSDP2 shards each stage on its own. Give the module a layer_idx of one "
                    "stage, or use virtual_pipeline_size=1 or stage 1/2"
                )


def apply_fully_shard(runner, *, hsdp_replicate_size: int = 1) -> FullyShardedGrads:
    """ZeRO stage 3 on ``runner``'s model (after the ModelRunner is built, before the
    optimizer): see the module doc. Checks every stage root first (no collective before an
    error), then shards. Returns the runner's new ``grads.sharder``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    util = runner.util
    roots = (
        [stage.submod for stage in runner.stage_schedule.stages]
        if runner.pipeline
        else [runner.model]
    )
    units = _units(roots)
    for root, blocks in units:
        check_fsdp_units(root, blocks)
    _check_disjoint(units)
    mesh = fsdp_mesh(util, hsdp_replicate_size)
    kwargs = {"mesh": mesh, "reshard_after_forward": not runner.pipeline}
    if runner.amp_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=runner.amp_dtype, reduce_dtype=torch.float32
        )
    attributes = {}
    # expert weights split over ep (libai.layers.moe) stay whole on their rank: FSDP2
    # ignores them, GradientSync sums their gradients over the expert-data group; routers'
    # expert biases (no gradient, moved after each step alike everywhere) stay whole too
    experts = {
        p
        for root, _ in units
        for p in root.parameters()
        if is_expert_parameter(p, util) or getattr(p, "libai_expert_bias", False)
    }
    if experts:
        kwargs["ignored_params"] = experts
    for root, blocks in units:
        _drop_dp_dim(root, util)
        for module in root.modules():  # FSDP2 registers new (sharded) parameter objects
            for name, p in module.named_parameters(recurse=False):
                if _libai_attributes(p):
                    attributes[(id(module), name)] = _libai_attributes(p)
        # [S(k)] on tp -> [S(0), S(k)] on (dp, tp) (_StridedShard(0) when k = 0), a plain
        # tensor -> [S(0)] on dp; HSDP prepends R on dp_replicate. Forward all-gathers over
        # the shard dim, backward reduce-scatters there (and all-reduces over replicas).
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(root, **kwargs)
        for module in root.modules():
            for name, p in module.named_parameters(recurse=False):
                p.__dict__.update(attributes.get((id(module), name), {}))
    if runner.pipeline and len(roots) > 1:
        _share_back(runner)
    runner.grads.tied_parameters = [
        p for p in runner.model.parameters() if getattr(p, "libai_tied_group", None) is not None
    ]
    group = mesh["dp_shard"].get_group() if hsdp_replicate_size > 1 else mesh.get_group()
    runner.grads.sharder = FullyShardedGrads(group)
    return runner.grads.sharder
