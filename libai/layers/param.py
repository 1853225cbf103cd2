"""Parameter factory: layout-independent initialization, then this rank's shard.

Every parameter draws one seed from the global torch RNG, in construction order, on every
rank, and its *full* value is generated from that seed alone. So a model built under any
dp × tp × pp layout starts from exactly the weights of the single-process model with the
same ``torch.manual_seed``. A rank then keeps only its share:

- a layer of another pipeline stage gets a ``meta`` parameter (no memory; pruned later);
- on a stage of one process the parameter is a plain tensor (no DTensor dispatch cost);
- otherwise it is a DTensor on the stage's (dp, tp) mesh: ``[B, S(k)]`` for tp-sharded
  weights, ``[B, B]`` for replicated ones.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from libai import dist

InitMethod = Callable[..., torch.Tensor]  # fn(tensor, generator=None) -> tensor, in place


def init_method_normal(sigma: float) -> InitMethod:
    """N(0, sigma) initialization."""

    def init_(tensor, generator=None):
        return nn.init.normal_(tensor, mean=0.0, std=sigma, generator=generator)

    return init_


def scaled_init_method_normal(sigma: float, num_layers: int) -> InitMethod:
    """N(0, sigma / sqrt(2 * num_layers)): GPT-2's init for layers that write the residual."""
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def xavier_normal(tensor, generator=None):
    return nn.init.xavier_normal_(tensor, generator=generator)


def zeros(tensor, generator=None):
    return nn.init.zeros_(tensor)


def ones(tensor, generator=None):
    return nn.init.ones_(tensor)


_SKIP_INIT = False


@contextlib.contextmanager
def skip_init():
    """Parameters created inside are allocated (this rank's shard only) but not initialized.

    For models whose weights are loaded right after construction (``load_huggingface``): no
    full-size tensor is generated. Seeds are still drawn, so the RNG stream is unchanged.
    """
    global _SKIP_INIT
    previous, _SKIP_INIT = _SKIP_INIT, True
    try:
        yield
    finally:
        _SKIP_INIT = previous


def create_parameter(
    shape: Sequence[int],
    init_method: InitMethod,
    *,
    layer_idx: int,
    tp_split_dim: int | None = None,
    padded_shape: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int | None = None,
    expert_split: bool = False,
) -> nn.Parameter:
    """Create this rank's share of a parameter whose full value is ``init_method(shape)``.

    Args:
        shape: full (logical) shape.
        init_method: ``fn(tensor, generator=None)`` filling the full tensor in place.
        layer_idx: the layer, hence pipeline stage, that owns the parameter.
        tp_split_dim: dim sharded over tensor-parallel ranks (``None`` = replicated).
        padded_shape: full shape after padding (e.g. vocab rounded up to a multiple of tp);
            the padding is zero-filled and never touches the RNG stream.
        seed: reuse another parameter's seed (a tied copy on another stage).
        expert_split: the stacked weights of a Mixture-of-Experts layer ``[experts, ...]``:
            dim 0 sharded over the expert-parallel ranks, on the mesh's expert mesh
            (``tp_split_dim`` must be None: experts are whole on every tp rank).
    """
    if expert_split and tp_split_dim is not None:
        raise ValueError("an expert weight is not split over tensor-parallel ranks")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), device="cpu").item())  # the CPU stream
    padded_shape = tuple(padded_shape or shape)
    util = dist.capture_mesh()
    tp = util.layout.tensor_parallel_size
    if tp_split_dim is not None and padded_shape[tp_split_dim] % tp:
        raise ValueError(
            f"parameter dim {tp_split_dim} of size {padded_shape[tp_split_dim]} is not divisible "
            f"by tensor_parallel_size={tp}"
        )
    local_shape = list(padded_shape)
    if tp_split_dim is not None:
        local_shape[tp_split_dim] //= tp
    ep = util.layout.expert_parallel_size if expert_split else 1
    if padded_shape[0] % ep:
        raise ValueError(
            f"{padded_shape[0]} experts do not split over train.dist.expert_parallel_size={ep}; "
            "use an expert_parallel_size that divides the number of experts"
        )
    local_shape[0] //= ep
    if not util.is_layer_local(layer_idx):
        param = nn.Parameter(torch.empty(local_shape, dtype=dtype, device="meta"))
        param.libai_global_shape = tuple(shape)  # the meta tensor has the tp-local shape
    elif _SKIP_INIT:
        local = torch.empty(local_shape, dtype=dtype, device=util.device)
        param = nn.Parameter(_wrap(local, tp_split_dim, util, expert_split))
        param.libai_deferred_init = (
            tuple(shape),
            padded_shape,
            init_method,
            seed,
            tp_split_dim,
            util,
            expert_split,
        )
    else:
        full = _full_value(shape, padded_shape, init_method, seed, dtype, util.device)
        param = nn.Parameter(_shard(full, tp_split_dim, util, expert_split))
    if expert_split:
        param.libai_expert = True  # its gradient is reduced over the expert-data ranks
    param.libai_init_seed = seed  # lets a tied copy on another stage start equal
    if padded_shape != tuple(shape):  # checkpoints store the logical (unpadded) shape
        param.libai_logical_shape = tuple(shape)
    return param


def init_deferred(param: nn.Parameter) -> None:
    """Give a parameter created under :func:`skip_init` the value it would have had (on the
    mesh it was created on)."""
    shape, padded_shape, init_method, seed, tp_split_dim, util, experts = param.libai_deferred_init
    full = _full_value(shape, padded_shape, init_method, seed, param.dtype, util.device)
    value = _shard(full, tp_split_dim, util, experts)
    with torch.no_grad():
        local_value(param).copy_(local_value(value))


def _full_value(shape, padded_shape, init_method, seed, dtype, device) -> torch.Tensor:
    # on the CPU, with its CPU generator, whatever the default device (a FleetX module is
    # built under ``torch.device("cuda")``): the same values on every device and layout
    generator = torch.Generator().manual_seed(seed)
    full = init_method(torch.empty(tuple(shape), dtype=dtype, device="cpu"), generator=generator)
    if tuple(padded_shape) != tuple(shape):
        padded = torch.zeros(padded_shape, dtype=dtype, device="cpu")
        padded[tuple(slice(0, s) for s in shape)] = full
        full = padded
    return full.to(device)


def _shard(full: torch.Tensor, tp_split_dim: int | None, util, experts=False) -> torch.Tensor:
    """Cut this rank's tp (or, for ``experts``, ep) shard out of ``full`` and wrap it as a
    DTensor on ``util``'s stage (expert) mesh."""
    if experts:
        ep = util.layout.expert_parallel_size
        local = full.chunk(ep, dim=0)[util.expert_parallel_rank].contiguous() if ep > 1 else full
        return _wrap(local, None, util, experts=True)
    if util.stage_mesh is None:
        return full
    local = full
    if tp_split_dim is not None and util.layout.tensor_parallel_size > 1:
        local = full.chunk(util.layout.tensor_parallel_size, dim=tp_split_dim)[
            util.tensor_parallel_rank
        ].contiguous()
    return _wrap(local, tp_split_dim, util)


def _wrap(local: torch.Tensor, tp_split_dim: int | None, util, experts=False) -> torch.Tensor:
    """This rank's shard as a DTensor on ``util``'s stage mesh, or its expert mesh for
    ``experts`` (a plain tensor on one process)."""
    if experts:
        if util.expert_mesh is None:
            return local
        return DTensor.from_local(local, util.expert_mesh, util.get_expert_sbp(), run_check=False)
    if util.stage_mesh is None:
        return local
    tp_sbp = dist.broadcast
    if tp_split_dim is not None and util.layout.tensor_parallel_size > 1:
        tp_sbp = dist.split(tp_split_dim)
    placements = util.get_nd_sbp([dist.broadcast, tp_sbp])
    return DTensor.from_local(local, util.stage_mesh, placements, run_check=False)


def mark_sequence_parallel(*params: torch.Tensor | None) -> None:
    """Mark replicated parameters used inside the sequence-parallel region (norm weights,
    row-parallel biases): each tp rank sees only its share of the sequence, so their
    gradients are partial sums over tp that the runner all-reduces
    (:meth:`~libai.runtime.parallel.ModelRunner.sync_gradients`), as Megatron does."""
    for param in params:
        if param is not None:
            param.libai_sequence_parallel = True


def local_value(param: torch.Tensor) -> torch.Tensor:
    """The local shard used in compute (differentiable); plain tensors pass through."""
    return param.to_local() if isinstance(param, DTensor) else param


#: N(0, 0.02), the default of LiBai's layers
default_init_method: InitMethod = init_method_normal(0.02)
