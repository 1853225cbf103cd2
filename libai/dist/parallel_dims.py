"""The sizes of a run's parallel dimensions, as one frozen object.

:class:`ParallelDims` is the layout as data: ``pp``, ``dp`` (split into ``dp_replicate`` x
``dp_shard`` for hybrid sharding), ``cp``, ``tp``, and ``ep``, which owns no ranks of its own
(experts borrow the ``dp_shard x cp`` ranks, as torchtitan and Megatron-Core do). It is
checked when built, before any process group exists, so every rank fails alike with one
line naming the key and the fix; it then builds the device mesh and gives the dims a layer's
placement spans.

The mesh is ``("pp", "dp", "cp", "tp")``, outermost first: tensor-parallel peers are
neighbouring ranks (one node's fast links), context-parallel peers the next closest, and
the pipeline stages the farthest apart. A dimension of size 1 is in the mesh too; the
placement of a layer (:meth:`stage_dims`) keeps only the dims of size > 1, so a single
process holds plain tensors.

Usage::

    dims = ParallelDims.resolve(world_size=8, tp=2, pp=2)   # dp = 8 / (2 x 2) = 2
    mesh = dims.build_mesh("cpu")                            # collective: every rank calls
    dims.stage_dims()                                        # ("dp", "tp")
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["MESH_DIMS", "ParallelDims", "positive_int"]

#: the mesh's dims, outermost first
MESH_DIMS = ("pp", "dp", "cp", "tp")
#: the ``train.dist`` key of each size a config sets, for the errors
KEYS = {
    "pp": "train.dist.pipeline_parallel_size",
    "cp": "train.dist.context_parallel_size",
    "tp": "train.dist.tensor_parallel_size",
    "ep": "train.dist.expert_parallel_size",
}


def positive_int(key: str, value) -> int:
    """``value`` as an ``int`` (numpy integers too); anything else than a positive integer
    (a bool, a float, 0) raises naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}.")
    return int(value)


def _positive(name: str, value) -> int:
    return positive_int(KEYS.get(name, f"ParallelDims.{name}"), value)


@dataclass(frozen=True)
class ParallelDims:
    """Every parallel size of a run; ``world_size`` is their product (``ep`` aside).

    Build it with :meth:`resolve` (which derives ``dp`` from the launch) or directly; both
    check it. Frozen: a transform reads it, never changes it.
    """

    world_size: int
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("world_size", "pp", "dp_replicate", "dp_shard", "cp", "tp", "ep"):
            _positive(name, getattr(self, name))
        product = self.pp * self.dp * self.cp * self.tp
        if product != self.world_size:
            raise ValueError(
                f"pipeline {self.pp} x data {self.dp} x context {self.cp} x tensor {self.tp} "
                f"parallel = {product} processes, but the world has {self.world_size}."
            )
        borrowed = self.dp_shard * self.cp
        if borrowed % self.ep:
            raise ValueError(
                f"{KEYS['ep']}={self.ep} must divide the data-sharding x "
                f"context-parallel ranks ({self.dp_shard} x {self.cp} = {borrowed}): experts "
                f"borrow those ranks. Use one of {_divisors(borrowed)}."
            )

    @classmethod
    def resolve(
        cls,
        world_size: int,
        *,
        tp=1,
        pp=1,
        cp=1,
        ep=1,
        dp=None,
    ) -> ParallelDims:
        """The dims of a launch of ``world_size`` processes: ``dp`` derived as
        ``world_size / (tp x pp x cp)`` (``None``, ``-1`` or ``"auto"``), or checked against
        that when given. Raises ``ValueError`` naming the ``train.dist`` key and the fix.
        The data-parallel ranks are one sharding group (``dp_replicate`` 1)."""
        tp, pp, cp, ep = (
            _positive(n, v) for n, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep))
        )
        model = tp * pp * cp
        named = f"tensor_parallel_size ({tp}) x pipeline_parallel_size ({pp})"
        if cp > 1:
            named += f" x context_parallel_size ({cp})"
        if world_size % model:
            raise ValueError(
                f"The world size ({world_size} processes) is not divisible by {named} = "
                f"{model}. Launch a multiple of {model} processes or change train.dist."
            )
        derived = world_size // model
        if dp not in (None, -1, "auto") and int(dp) != derived:
            sizes = f"tensor_parallel_size {tp} x pipeline_parallel_size {pp}"
            sizes += f" x context_parallel_size {cp}" if cp > 1 else ""
            raise ValueError(
                f"train.dist.data_parallel_size={dp} contradicts the launch: {world_size} "
                f"processes / ({sizes}) = {derived}. Set data_parallel_size={derived} or None "
                f"(derived), or launch {int(dp) * model} processes."
            )
        return cls(world_size=world_size, pp=pp, dp_shard=derived, cp=cp, tp=tp, ep=ep)

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel ranks: ``dp_replicate x dp_shard`` (each sees other samples)."""
        return self.dp_replicate * self.dp_shard

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp, self.cp, self.tp)

    def size(self, name: str) -> int:
        """The size of mesh dim ``name`` (one of :data:`MESH_DIMS`)."""
        if name not in MESH_DIMS:
            raise KeyError(f"no mesh dim {name!r}; the dims are {MESH_DIMS}")
        return dict(zip(MESH_DIMS, self.mesh_shape))[name]

    def stage_dims(self) -> tuple[str, ...]:
        """The dims a layer's placement spans inside its pipeline stage, size > 1 only:
        ``("dp", "tp")`` for dp2 x tp2, ``()`` for one process per stage."""
        return tuple(name for name in ("dp", "tp") if self.size(name) > 1)

    # ---- the mesh -------------------------------------------------------------------------
    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The ``("pp", "dp", "cp", "tp")`` device mesh (a collective: every rank calls it,
        in the same order, after the default process group exists)."""
        return init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=MESH_DIMS)

    def describe(self) -> str:
        """One line for the log: each size, and the world."""
        sizes = " ".join(f"{n}={s}" for n, s in zip(MESH_DIMS, self.mesh_shape))
        extra = f" (dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard})"
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        return f"mesh {sizes}{extra if self.dp_replicate > 1 else ''}{ep} (world {self.world_size})"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
