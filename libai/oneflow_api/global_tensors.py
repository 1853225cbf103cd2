"""OneFlow's global-tensor vocabulary for LiBai project code, on the runtime's tensors.

OneFlow describes a tensor by a *placement* (the devices) and an *sbp* per mesh dim
(split / broadcast / partial_sum); DTensor describes it by a ``DeviceMesh`` and one
``Placement`` per dim (``Shard`` / ``Replicate`` / ``Partial``), the same idea. The runtime
passes activations between layers as **plain local tensors** (this rank's share, in the layout
the layers ask for: see :mod:`libai.dist`), and keeps DTensors for the parameters. So:

- a plain tensor is the local view of a global tensor. Its ``placement`` is
  :class:`Placement` (its device, no mesh) and its ``sbp`` is broadcast on every stage-mesh
  dim: used in ``flow.tensor(data, sbp=t.sbp, placement=t.placement)`` it gives a plain tensor
  holding ``data`` on ``t``'s device, as the project means;
- ``to_global`` of a plain tensor returns it unchanged: the conversions LiBai's projects ask
  for on activations (``[P, P] -> [P, B]`` of a loss, a label moved to the logits' placement)
  are ones the runtime's layers have already made (a row-parallel output is reduced over tp
  inside the layer);
- ``to_global`` of a DTensor is ``redistribute`` onto the placement and sbp given;
- a creation function given a multi-rank ``DeviceMesh`` (``dist.get_layer_placement``) and an
  sbp builds the global tensor from the arguments (which describe the whole tensor, as in
  OneFlow) and returns this rank's local view (``Shard`` keeps its chunk, ``Partial`` keeps
  the value on the first rank of that dim and zeros elsewhere).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from libai import dist

__all__ = [
    "CREATION_FUNCTIONS",
    "Placement",
    "creation",
    "install_tensor_methods",
    "placement_of",
    "sbp_of",
    "to_global",
    "to_local",
]

#: torch functions that OneFlow's global API calls with ``sbp=`` / ``placement=`` keywords
CREATION_FUNCTIONS = (
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "linspace",
)


@dataclass(frozen=True)
class Placement:
    """OneFlow's ``flow.placement(type, ranks)``: where a tensor lives. ``type`` is the
    device type ("cuda" / "cpu"); ``ranks`` the global ranks (OneFlow's list or nested list);
    ``device`` set for a plain tensor's own placement (its exact device)."""

    type: str = "cpu"
    ranks: tuple = field(default=(0,))
    device: torch.device | None = None

    def __init__(self, type: str = "cpu", ranks=(0,), *, device=None):  # noqa: A002 (OneFlow's name)
        if isinstance(type, torch.device):  # a device given for its type (a pipeline's)
            type = type.type  # noqa: A001
        if type not in ("cpu", "cuda"):
            raise ValueError(f"oneflow.placement type must be 'cpu' or 'cuda', got {type!r}")
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "ranks", tuple(torch.tensor(ranks).flatten().tolist()))
        object.__setattr__(self, "device", None if device is None else torch.device(device))

    @classmethod
    def all(cls, type: str = "cpu") -> Placement:  # noqa: A002
        """``flow.placement.all(type)``: every rank of the run."""
        return cls(type, range(dist.get_world_size()))

    def torch_device(self) -> torch.device:
        """The device a tensor placed here is created on (this rank's)."""
        if self.device is not None:
            return self.device
        util = dist.current_dist_util()
        if util is not None and util.device.type == self.type:
            return util.device
        if self.type == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def placement_of(tensor: torch.Tensor):
    """``tensor.placement``: a DTensor's mesh; a plain tensor's :class:`Placement` (its
    device, the rank it is on)."""
    if isinstance(tensor, DTensor):
        return tensor.device_mesh
    return Placement(tensor.device.type, (dist.get_rank(),), device=tensor.device)


def sbp_of(tensor: torch.Tensor) -> tuple:
    """``tensor.sbp``: a DTensor's placements; broadcast on each stage-mesh dim for a plain
    tensor (the local view is what this rank holds whole)."""
    if isinstance(tensor, DTensor):
        return tuple(tensor.placements)
    util = dist.current_dist_util()
    dims = len(util.stage_dims) if util is not None else 0
    return (dist.broadcast,) * dims


def _mesh_and_sbp(placement, sbp):
    """``(DeviceMesh, placements)`` when the tensor is global over more than one rank, else
    ``(None, None)``; checks an sbp against the mesh's dims."""
    if not isinstance(placement, DeviceMesh) or placement.size() == 1:
        return None, None
    sbp = list(sbp) if isinstance(sbp, (list, tuple)) else [sbp]
    sbp = sbp or [Replicate()] * placement.ndim
    if len(sbp) != placement.ndim:
        raise ValueError(
            f"sbp {sbp} has {len(sbp)} entries for a placement of {placement.ndim} dims "
            f"{placement.mesh_dim_names}; build it with dist.get_nd_sbp([dp_sbp, tp_sbp])"
        )
    return placement, sbp


def _device_of(placement, device):
    if device is not None:
        return device
    if isinstance(placement, Placement):
        return placement.torch_device()
    if isinstance(placement, DeviceMesh):
        util = dist.current_dist_util()
        return util.device if util is not None else torch.device(placement.device_type)
    util = dist.current_dist_util()
    return util.device if util is not None else None


def creation(fn):
    """``fn`` (a torch creation function) taking OneFlow's ``sbp`` / ``placement`` keywords:
    the arguments describe the whole tensor; the result is this rank's local view."""

    @functools.wraps(fn)
    def create(*args, sbp=None, placement=None, device=None, **kwargs):
        if isinstance(placement, str):  # flow.tensor(x, placement="cuda") is a device
            device, placement = placement, None
        device = _device_of(placement, device)
        whole = fn(*args, **kwargs) if device is None else fn(*args, device=device, **kwargs)
        mesh, placements = _mesh_and_sbp(placement, sbp)
        if mesh is None:
            return whole
        # whole tensor on every rank -> this rank's share: [B] -> [sbp]
        return distribute_tensor(whole, mesh, placements, src_data_rank=None).to_local()

    return create


def to_global(tensor: torch.Tensor, placement=None, sbp=None, **_unused):
    """OneFlow's ``Tensor.to_global`` (and ``to_consistent``): a DTensor is redistributed onto
    ``placement`` (default: its mesh) and ``sbp``; a plain tensor, the runtime's local view,
    is returned unchanged (see the module doc)."""
    if not isinstance(tensor, DTensor):
        return tensor
    mesh = placement if isinstance(placement, DeviceMesh) else tensor.device_mesh
    if sbp is None:
        return tensor if mesh is tensor.device_mesh else tensor.redistribute(mesh)
    sbp = list(sbp) if isinstance(sbp, (list, tuple)) else [sbp]
    # [current sbp] -> [sbp], the same global value
    return tensor.redistribute(mesh, sbp)


def to_local(tensor: torch.Tensor) -> torch.Tensor:
    """``Tensor.to_local()``: a plain tensor is its own local view."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


#: the Tensor attributes OneFlow has and torch does not, added to ``torch.Tensor`` once
#: project code imports ``oneflow`` (never replacing an attribute torch defines)
TENSOR_METHODS = {
    "to_global": to_global,
    "to_consistent": to_global,
    "to_local": to_local,
    "sbp": property(sbp_of),
    "placement": property(placement_of),
    "is_global": property(lambda t: isinstance(t, DTensor)),
    "is_consistent": property(lambda t: isinstance(t, DTensor)),
}


def install_tensor_methods() -> None:
    """Give ``torch.Tensor`` OneFlow's global-tensor attributes that torch lacks (idempotent;
    DTensor's own ``to_local`` stays DTensor's)."""
    for name, value in TENSOR_METHODS.items():
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, value)
