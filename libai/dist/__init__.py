"""The process mesh and LiBai's placement vocabulary on top of PyTorch DTensor.

One global :class:`~torch.distributed.device_mesh.DeviceMesh` with dims ``("pp", "dp", "cp", "tp")``
(tp innermost, so tensor-parallel peers are neighbouring ranks) describes the layout. A layer
asks for its *placement* (the (dp, tp) sub-mesh of the pipeline stage that owns it) and its
*nd-sbp* (one DTensor placement per mesh dim that exists), exactly like LiBai asks OneFlow for
``flow.placement`` and ``flow.sbp``. A single process is a mesh of size 1: the same code path,
with plain tensors and no communication.

Usage::

    from libai import dist

    dist.setup_dist_util({"tensor_parallel_size": 2, "pipeline_parallel_size": 1})
    mesh = dist.get_layer_placement(layer_idx=0)  # None when the stage is one process
    sbp = dist.get_nd_sbp([dist.broadcast, dist.split(0)])
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from libai.dist.parallel_dims import ParallelDims, positive_int

logger = logging.getLogger(__name__)

# LiBai's SBP names for DTensor placements.
broadcast: Placement = Replicate()
partial_sum: Placement = Partial()


def split(dim: int) -> Placement:
    """LiBai's ``flow.sbp.split(dim)``: the tensor is sharded along ``dim``."""
    return Shard(dim)


#: Keys accepted in the ``dist`` config (LiBai's names, plus ours marked below).
DIST_CONFIG_KEYS = {
    "data_parallel_size": None,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "pipeline_num_layers": None,
    "custom_pipeline_stage_id": None,
    "device_type": "cpu",
    # ours: model chunks per pipeline rank (interleaved schedules need > 1)
    "virtual_pipeline_size": 1,
    # ours: torch.distributed.pipelining schedule name, see libai.runtime.parallel
    "pipeline_schedule": "1F1B",
    # ours: Megatron-style sequence parallel over the tp group (needs tensor_parallel_size > 1)
    "sequence_parallel": False,
    # ours (Megatron's name): each sequence split over this many ranks, attention across them
    "context_parallel_size": 1,
    # ours (Megatron's expert_model_parallel_size): Mixture-of-Experts layers' experts
    # sharded over this many of the data x context-parallel ranks (libai.layers.moe)
    "expert_parallel_size": 1,
}


def dist_config_items(dist_cfg) -> dict:
    """The items of a ``train.dist`` config (a mapping or namespace); an unknown key raises
    naming the closest valid ones."""
    if dist_cfg is None:
        return {}
    if isinstance(dist_cfg, Mapping):
        items = dict(dist_cfg.items())
    else:
        items = {k: v for k, v in vars(dist_cfg).items() if not k.startswith("_")}
    unknown = [k for k in items if k not in DIST_CONFIG_KEYS]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, DIST_CONFIG_KEYS, n=2)
            hints.append(f"'{key}'" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        raise ValueError(
            f"Unknown key(s) in train.dist: {', '.join(hints)}. "
            f"Valid keys: {', '.join(sorted(DIST_CONFIG_KEYS))}."
        )
    return items


def _positive_int(name: str, value) -> int:
    return positive_int(f"train.dist.{name}", value)


@dataclass(frozen=True)
class DistLayout:
    """The validated sizes and stage assignment; computed before any process group exists."""

    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    virtual_pipeline_size: int = 1
    pipeline_num_layers: int | None = None
    #: virtual stage id of each layer (``pp * virtual_pipeline_size`` stages in all)
    layer_stage_ids: tuple[int, ...] = field(default_factory=tuple)
    device_type: str = "cpu"
    pipeline_schedule: str = "1F1B"
    #: norms, dropout and residuals of each block split along the sequence over tp
    sequence_parallel: bool = False
    #: ranks each sequence is split over (context parallel, :mod:`libai.layers.context_parallel`)
    context_parallel_size: int = 1
    #: data x context-parallel ranks the experts of Mixture-of-Experts layers are split
    #: over (:mod:`libai.layers.moe`); each expert is replicated over ``dp x cp / ep`` of them
    expert_parallel_size: int = 1

    @property
    def num_stages(self) -> int:
        return self.pipeline_parallel_size * self.virtual_pipeline_size

    @property
    def dims(self) -> ParallelDims:
        """The sizes as the mesh object (:class:`~libai.dist.parallel_dims.ParallelDims`)."""
        return ParallelDims(
            world_size=self.world_size,
            pp=self.pipeline_parallel_size,
            dp_shard=self.data_parallel_size,
            cp=self.context_parallel_size,
            tp=self.tensor_parallel_size,
            ep=self.expert_parallel_size,
        )


def resolve_layout(dist_cfg, world_size: int) -> DistLayout:
    """Validate ``dist_cfg`` against ``world_size`` and resolve the stage id of every layer.

    Raises ``ValueError`` naming the offending key; runs no collective, so every rank fails
    the same way before any process can hang.
    """
    cfg = {**DIST_CONFIG_KEYS, **dist_config_items(dist_cfg)}
    tp = _positive_int("tensor_parallel_size", cfg["tensor_parallel_size"])
    pp = _positive_int("pipeline_parallel_size", cfg["pipeline_parallel_size"])
    vpp = _positive_int("virtual_pipeline_size", cfg["virtual_pipeline_size"])
    if vpp > 1 and pp == 1:
        raise ValueError("train.dist.virtual_pipeline_size > 1 needs pipeline_parallel_size > 1.")
    device_type = cfg["device_type"]
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"train.dist.device_type must be 'cpu' or 'cuda', got {device_type!r}.")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "train.dist.device_type='cuda' but no CUDA device is available; use 'cpu'."
        )
    cp = _positive_int("context_parallel_size", cfg["context_parallel_size"])
    ep = _positive_int("expert_parallel_size", cfg["expert_parallel_size"])
    dims = ParallelDims.resolve(
        world_size, tp=tp, pp=pp, cp=cp, ep=ep, dp=cfg["data_parallel_size"]
    )
    sequence_parallel = _sequence_parallel(cfg["sequence_parallel"], tp)
    dp = dims.dp
    num_layers = cfg["pipeline_num_layers"]
    custom = cfg["custom_pipeline_stage_id"]
    num_stages = pp * vpp
    stage_ids: tuple[int, ...] = ()
    if custom is not None:
        custom = [int(s) for s in custom]
        if num_layers is None:
            num_layers = len(custom)
        stage_ids = _check_custom_stage_ids(custom, int(num_layers), num_stages)
    elif num_layers is not None:
        num_layers = _positive_int("pipeline_num_layers", num_layers)
        if num_layers < num_stages:
            raise ValueError(
                f"pipeline_parallel_size ({pp}) x virtual_pipeline_size ({vpp}) = {num_stages} "
                f"pipeline stages but only {num_layers} layers (train.dist.pipeline_num_layers): "
                f"every stage needs at least one layer. Lower pipeline_parallel_size."
            )
        stage_ids = tuple(i * num_stages // num_layers for i in range(num_layers))
    elif num_stages > 1:
        raise ValueError(
            "train.dist.pipeline_num_layers must be set (the model's number of layers) when "
            f"pipeline_parallel_size x virtual_pipeline_size = {num_stages} > 1."
        )
    return DistLayout(
        world_size=world_size,
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        virtual_pipeline_size=vpp,
        pipeline_num_layers=None if num_layers is None else int(num_layers),
        layer_stage_ids=stage_ids,
        device_type=device_type,
        pipeline_schedule=str(cfg["pipeline_schedule"]),
        sequence_parallel=sequence_parallel,
        context_parallel_size=cp,
        expert_parallel_size=ep,
    )


def _sequence_parallel(value, tp: int) -> bool:
    """Validate ``train.dist.sequence_parallel`` (a bool that needs tp > 1)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"train.dist.sequence_parallel must be True or False, got {value!r}.")
    if value and tp == 1:
        raise ValueError(
            "train.dist.sequence_parallel=True needs tensor_parallel_size > 1: it splits the "
            "sequence over the tensor-parallel group. Set train.dist.tensor_parallel_size to 2 "
            "or more, or train.dist.sequence_parallel=False."
        )
    return bool(value)


def _check_custom_stage_ids(ids: list[int], num_layers: int, num_stages: int) -> tuple[int, ...]:
    if len(ids) != num_layers:
        raise ValueError(
            f"train.dist.custom_pipeline_stage_id has {len(ids)} entries but the model has "
            f"{num_layers} layers (train.dist.pipeline_num_layers): give one stage id per layer."
        )
    bad = [s for s in ids if not 0 <= s < num_stages]
    if bad:
        raise ValueError(
            f"train.dist.custom_pipeline_stage_id has stage ids {sorted(set(bad))} outside "
            f"[0, {num_stages - 1}] (pipeline_parallel_size x virtual_pipeline_size = {num_stages})."
        )
    if any(b < a for a, b in zip(ids, ids[1:])):
        raise ValueError(
            f"train.dist.custom_pipeline_stage_id must be non-decreasing (layers flow from "
            f"stage 0 to the last stage), got {ids}."
        )
    missing = sorted(set(range(num_stages)) - set(ids))
    if missing:
        raise ValueError(
            f"train.dist.custom_pipeline_stage_id leaves stages {missing} without layers; "
            "every pipeline stage needs at least one layer."
        )
    return tuple(ids)


class DistUtil:
    """The process mesh of this run and the helpers that answer 'where does this live'."""

    def __init__(self, layout: DistLayout, mesh: DeviceMesh):
        self.layout = layout
        self.mesh = mesh
        self.rank = torch_dist.get_rank()
        self.device = torch.device(
            layout.device_type,
            torch.cuda.current_device() if layout.device_type == "cuda" else None,
        )
        coord = dict(zip(mesh.mesh_dim_names, mesh.get_coordinate()))
        self.pipeline_rank, self.data_parallel_rank = coord["pp"], coord["dp"]
        self.context_parallel_rank, self.tensor_parallel_rank = coord["cp"], coord["tp"]
        # The (dp, tp) sub-mesh of this rank's stage, keeping only dims of size > 1.
        self.stage_dims = layout.dims.stage_dims()
        self.stage_mesh = mesh[self.stage_dims] if self.stage_dims else None
        self.tp_group = mesh["tp"].get_group() if layout.tensor_parallel_size > 1 else None
        self.dp_group = mesh["dp"].get_group() if layout.data_parallel_size > 1 else None
        self.pp_group = mesh["pp"].get_group() if layout.pipeline_parallel_size > 1 else None
        self.cp_group = mesh["cp"].get_group() if layout.context_parallel_size > 1 else None
        #: the ranks that hold the same parameters and see different tokens (dp x cp): the
        #: gradients and the loss are averaged over them
        self.grad_group, self.grad_size = self._new_grad_group()
        self.embedding_group = self._new_embedding_group()
        self._new_expert_groups()

    def __deepcopy__(self, memo):
        """A mesh is shared, never copied: a deep copy of a model (a pipeline stage's copy)
        runs on the same mesh and groups as the model."""
        return self

    @property
    def tensor_parallel_size(self) -> int:
        return self.layout.tensor_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.layout.data_parallel_size

    def _new_grad_group(self):
        """``(group, size)`` of the dp x cp ranks with this rank's (pp, tp) coordinate: the
        dp group when cp == 1, ``(None, 1)`` when that is one rank."""
        layout = self.layout
        size = layout.data_parallel_size * layout.context_parallel_size
        if layout.context_parallel_size == 1 or size == 1:
            return self.dp_group, size
        ranks = self.mesh.mesh  # ("pp", "dp", "cp", "tp")
        pp_tp = itertools.product(range(ranks.shape[0]), range(ranks.shape[3]))
        return self._own_group(
            [int(r) for r in ranks[p, :, :, t].flatten()] for p, t in pp_tp
        ), size

    def _own_group(self, member_lists):
        """A process group for each list of ranks (a collective: every rank creates every
        group, in the same order); the one this rank is in."""
        mine = None
        for members in member_lists:
            group = torch_dist.new_group(members)
            if self.rank in members:
                mine = group
        return mine

    @property
    def context_parallel_size(self) -> int:
        return self.layout.context_parallel_size

    @property
    def expert_parallel_size(self) -> int:
        return self.layout.expert_parallel_size

    def _new_expert_groups(self) -> None:
        """The expert layout (:mod:`libai.layers.moe`): the data x context-parallel ranks of
        a stage (the ranks that hold the same parameters and see other tokens, ordered
        (dp, cp)) split as ``dp x cp = edp x ep``, neighbours forming an ep group.

        - ``ep_group``: the ranks whose experts together make a layer's experts, and among
          which tokens are exchanged (same pp, tp and edp coordinate);
        - ``expert_grad_group``: the ranks holding the same experts (edp; ``None`` when one):
          expert gradients are summed there;
        - ``expert_mesh``: the stage's ``("edp", "ep", "tp")`` mesh, dims of size > 1 only
          (``None`` for one process), on which expert weights are DTensors ``Shard(0)`` over ep.
        """
        layout, ep = self.layout, self.layout.expert_parallel_size
        self.expert_parallel_rank, self.ep_group, self.expert_grad_group = 0, None, None
        self.expert_mesh, self.expert_dims = None, ()
        if ep == 1:  # experts are laid out like any replicated weight
            self.expert_mesh, self.expert_dims = self.stage_mesh, self.stage_dims
            return
        pp, dp, cp, tp = (
            layout.pipeline_parallel_size,
            layout.data_parallel_size,
            layout.context_parallel_size,
            layout.tensor_parallel_size,
        )
        edp = dp * cp // ep
        # ("pp", "dp", "cp", "tp") -> ("pp", "dp x cp", "tp") -> ("pp", "edp", "ep", "tp")
        ranks = self.mesh.mesh.reshape(pp, dp * cp, tp).reshape(pp, edp, ep, tp)
        full = DeviceMesh(self.mesh.device_type, ranks, mesh_dim_names=("pp", "edp", "ep", "tp"))
        coord = dict(zip(full.mesh_dim_names, full.get_coordinate()))
        self.expert_parallel_rank = coord["ep"]
        self.ep_group = full["ep"].get_group()
        self.expert_grad_group = full["edp"].get_group() if edp > 1 else None
        self.expert_dims = tuple(n for n, s in (("edp", edp), ("ep", ep), ("tp", tp)) if s > 1)
        self.expert_mesh = full[self.expert_dims]

    def get_expert_sbp(self) -> list[Placement]:
        """The placements of an expert weight ``[experts, ...]`` on :attr:`expert_mesh`:
        ``Shard(0)`` over ep, replicated over edp and tp."""
        by_dim = {"edp": broadcast, "ep": split(0), "tp": broadcast, "dp": broadcast}
        return [by_dim[name] for name in self.expert_dims]

    def _new_embedding_group(self):
        """Group of {first stage, last stage} ranks with the same (dp, tp) coordinate.

        Tied word embeddings live on both; their gradients are all-reduced in this group.
        """
        pp = self.layout.pipeline_parallel_size
        if pp == 1:
            return None
        ranks = self.mesh.mesh  # ("pp", "dp", "cp", "tp")
        coordinates = itertools.product(*(range(n) for n in ranks.shape[1:]))
        return self._own_group(
            [int(ranks[0, d, c, t]), int(ranks[pp - 1, d, c, t])] for d, c, t in coordinates
        )

    # ---- stages ---------------------------------------------------------------------------
    def get_layer_stage(self, layer_idx: int) -> int:
        """Virtual pipeline stage that owns ``layer_idx`` (``-1`` = the last layer/stage)."""
        ids = self.layout.layer_stage_ids
        if not ids:
            return 0
        if layer_idx < 0:
            layer_idx += len(ids)
        if not 0 <= layer_idx < len(ids):
            raise IndexError(f"layer_idx {layer_idx} out of range for {len(ids)} pipeline layers")
        return ids[layer_idx]

    def stage_to_pipeline_rank(self, stage: int) -> int:
        return stage % self.layout.pipeline_parallel_size

    def is_layer_local(self, layer_idx: int) -> bool:
        """Whether this rank builds and runs ``layer_idx`` (its stage is on this rank)."""
        stage = self.get_layer_stage(layer_idx)
        return self.stage_to_pipeline_rank(stage) == self.pipeline_rank

    def local_stages(self) -> list[int]:
        """Virtual stage ids held by this rank, in pipeline order."""
        pp = self.layout.pipeline_parallel_size
        return list(range(self.pipeline_rank, self.layout.num_stages, pp))

    def get_layer_placement(self, layer_idx: int) -> DeviceMesh | None:
        """The (dp, tp) sub-mesh of the stage owning ``layer_idx``, with only dims of size > 1.

        ``None`` means the stage runs on one process: tensors there are plain tensors. Only
        the stage's own ranks build a layer; asking for another stage's placement is an error.
        """
        if not self.is_layer_local(layer_idx):
            raise ValueError(
                f"layer {layer_idx} belongs to pipeline stage {self.get_layer_stage(layer_idx)}, "
                f"not to this rank's stage {self.pipeline_rank}."
            )
        return self.stage_mesh

    def get_nd_sbp(self, sbp: Sequence[Placement]) -> list[Placement]:
        """``[dp_sbp, tp_sbp]`` collapsed to the stage-mesh dims that exist (size > 1)."""
        if len(sbp) != 2:
            raise ValueError(f"get_nd_sbp takes [dp_sbp, tp_sbp], got {sbp!r}")
        by_dim = {"dp": sbp[0], "tp": sbp[1]}
        return [by_dim[name] for name in self.stage_dims]


_DIST_UTIL: DistUtil | None = None


def _init_process_group(device_type: str) -> None:
    if torch_dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch_dist.init_process_group(backend, timeout=timedelta(minutes=10))
    else:  # a plain `python script.py`: a world of one, no launcher needed
        torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)


def setup_dist_util(dist_cfg=None) -> DistUtil:
    """Build the ``("pp", "dp", "cp", "tp")`` mesh from ``dist_cfg`` and the torchrun environment
    (its sizes: :class:`~libai.dist.parallel_dims.ParallelDims`, ``layout.dims``).

    ``dist_cfg`` is a mapping (e.g. ``cfg.train.dist``) with LiBai's keys
    (:data:`DIST_CONFIG_KEYS`). Without torchrun this is a single process. The layout is
    validated before the process group is touched. Returns the new :class:`DistUtil`.
    """
    global _DIST_UTIL
    items = dist_config_items(dist_cfg)
    world_size = (
        torch_dist.get_world_size()
        if torch_dist.is_initialized()
        else int(os.environ.get("WORLD_SIZE", 1))
    )
    layout = resolve_layout(items, world_size)
    _init_process_group(layout.device_type)
    mesh = layout.dims.build_mesh(layout.device_type)
    _DIST_UTIL = DistUtil(layout, mesh)
    if dist_cfg is not None and isinstance(dist_cfg, Mapping) and layout.layer_stage_ids:
        _record_resolved_layout(dist_cfg, layout)
    logger.info("%s stage ids %s", layout.dims.describe(), list(layout.layer_stage_ids))
    return _DIST_UTIL


def _record_resolved_layout(dist_cfg, layout: DistLayout) -> None:
    """Write the derived dp size and per-layer stage ids back into the config (LiBai does too)."""
    try:
        dist_cfg["data_parallel_size"] = layout.data_parallel_size
        dist_cfg["custom_pipeline_stage_id"] = list(layout.layer_stage_ids)
        dist_cfg["pipeline_num_layers"] = layout.pipeline_num_layers
    except Exception:  # read-only configs are fine: the layout object is the source of truth
        pass


def get_dist_util() -> DistUtil:
    """The current :class:`DistUtil`; a single-process one is created on first use."""
    if _DIST_UTIL is None:
        setup_dist_util()
    return _DIST_UTIL


def current_dist_util() -> DistUtil | None:
    """The current :class:`DistUtil`, or ``None`` when no mesh is set up (unlike
    :func:`get_dist_util`, which builds a single-process one)."""
    return _DIST_UTIL


@contextlib.contextmanager
def use_dist_util(util):
    """Make ``util`` (a :class:`DistUtil` or a stand-in with its interface, e.g. the memory
    estimator's counting mesh) the current one inside the block; the previous one after."""
    global _DIST_UTIL
    previous, _DIST_UTIL = _DIST_UTIL, util
    try:
        yield util
    finally:
        _DIST_UTIL = previous


def capture_mesh() -> DistUtil:
    """The mesh a module being built lays itself out on (the current :class:`DistUtil`).

    A layer calls this in ``__init__`` and keeps the answer: its forward uses the kept mesh's
    groups and ranks, never the mesh current when it runs. So two models built on two meshes
    (each inside :func:`use_dist_util`) train side by side in one process group.
    """
    return get_dist_util()


def mesh_of(module) -> DistUtil:
    """The mesh ``module``'s layers were built on (the one they captured, see
    :func:`capture_mesh`); the current mesh for a module without libai layers (e.g. a plain
    Hugging Face model)."""
    for sub in module.modules():
        util = sub.__dict__.get("_dist_util")
        if util is not None:
            return util
    return get_dist_util()


def reset_dist_util() -> None:
    """Forget the current mesh (the process group stays); mainly for tests."""
    global _DIST_UTIL
    _DIST_UTIL = None


def destroy_dist() -> None:
    """Tear down cleanly: barrier, then destroy the process group (avoids aborts at exit)."""
    global _DIST_UTIL
    if torch_dist.is_initialized():
        if torch_dist.get_world_size() > 1:
            torch_dist.barrier()
        torch_dist.destroy_process_group()
    _DIST_UTIL = None


def check_model_num_layers(num_layers: int, described: str) -> None:
    """A model being built has ``num_layers`` pipeline layers (``described``, e.g.
    ``"hidden_layers=12"``): under a stage split they must be ``train.dist.pipeline_num_layers``,
    else one line naming both and the fix."""
    layout = get_dist_util().layout
    if layout.layer_stage_ids and layout.pipeline_num_layers != num_layers:
        raise ValueError(
            f"train.dist.pipeline_num_layers={layout.pipeline_num_layers} but the model has "
            f"{described}; set pipeline_num_layers={num_layers}."
        )


# ---- LiBai's module-level vocabulary ----------------------------------------------------------
def get_layer_placement(layer_idx: int) -> DeviceMesh | None:
    return get_dist_util().get_layer_placement(layer_idx)


def get_nd_sbp(sbp: Sequence[Placement]) -> list[Placement]:
    return get_dist_util().get_nd_sbp(sbp)


def get_hidden_sbp() -> list[Placement]:
    """Activations between layers: batch split over dp, broadcast over tp."""
    return get_nd_sbp([split(0), broadcast])


def convert_to_distributed_default_setting(tensor: torch.Tensor) -> torch.Tensor:
    """LiBai's ``module._apply(dist.convert_to_distributed_default_setting)``: a tensor a
    project created outside the parallel layers, made global on the default placement
    (broadcast). Here: a plain tensor moved to this rank's device (each rank holds it whole);
    a DTensor (a parallel layer's) stays as it is."""
    if isinstance(tensor, DTensor):
        return tensor
    return tensor.to(get_dist_util().device)


def get_rank() -> int:
    return torch_dist.get_rank() if torch_dist.is_initialized() else 0


def get_world_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def get_data_parallel_rank() -> int:
    return get_dist_util().data_parallel_rank


def get_data_parallel_size() -> int:
    return get_dist_util().layout.data_parallel_size


def get_tensor_parallel_rank() -> int:
    return get_dist_util().tensor_parallel_rank


def get_tensor_parallel_size() -> int:
    return get_dist_util().layout.tensor_parallel_size


def get_context_parallel_size() -> int:
    return get_dist_util().layout.context_parallel_size


def is_sequence_parallel() -> bool:
    """Whether ``train.dist.sequence_parallel`` is on (then tp > 1): models that support it
    keep the activations between their tensor-parallel regions split along the sequence."""
    return get_dist_util().layout.sequence_parallel


def get_pipeline_parallel_rank() -> int:
    return get_dist_util().pipeline_rank


def get_pipeline_parallel_size() -> int:
    return get_dist_util().layout.pipeline_parallel_size


def is_main_process() -> bool:
    return get_rank() == 0


def is_last_process() -> bool:
    return get_rank() == get_world_size() - 1


def synchronize() -> None:
    """Barrier across all ranks (no-op for one process)."""
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.barrier()


def broadcast_py_object(obj, src: int = 0):
    """Send a picklable object from rank ``src`` to every rank and return it."""
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return obj
    box = [obj if get_rank() == src else None]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def ttol(tensor: torch.Tensor, ranks: Sequence[int] | None = None) -> torch.Tensor | None:
    """Global to local: the full tensor as a plain local tensor.

    With ``ranks=None`` every rank of the tensor's mesh gets it; otherwise only the listed
    ranks do and the others get ``None``. A plain tensor is returned as is.
    """
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    if ranks is not None and get_rank() not in ranks:
        return None
    return full


def tton(tensor: torch.Tensor, ranks: Sequence[int] | None = None) -> np.ndarray | None:
    """Global to numpy: :func:`ttol` then ``.numpy()`` (on the listed ranks, or all)."""
    full = ttol(tensor, ranks)
    return None if full is None else full.detach().cpu().numpy()
