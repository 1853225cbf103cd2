"""LiBai's sample containers: ``Instance`` (named fields) holding ``DistTensorData``
(a tensor and the placement LiBai gives it).

A LiBai dataset returns ``Instance(input_ids=DistTensorData(ids), labels=...)`` per sample;
the loaders' collate (:func:`libai.data.build.trivial_batch_collator`) stacks those into one
``Instance`` and hands the runtime a dict of ``[batch, ...]`` tensors, which is what every
model here takes. Under data parallel each rank's loader already yields its own share of the
global batch -- LiBai's ``split_0`` over dp -- and the runtime moves it to the rank's device,
so a sample's ``sbp_list`` / ``placement_idx`` are kept for LiBai code that reads them and
need no conversion.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from libai import dist

__all__ = ["DistTensorData", "Instance"]


@dataclass
class DistTensorData:
    """A tensor of one sample (or, after :meth:`stack`, of a batch) with LiBai's layout
    hints: ``sbp_list`` (``"split_0"``, ``"broadcast"``) and ``placement_idx`` (the layer
    whose stage reads it)."""

    tensor: torch.Tensor
    sbp_list: list = field(default_factory=lambda: ["split_0", "broadcast"])
    placement_idx: int = 0

    def to_global(self, sbp=None, placement=None, device_type: str | None = None):
        """Move the tensor to this rank's device (it is this rank's share already, see the
        module doc); returns ``self``."""
        util = dist.current_dist_util()
        device = util.device if util is not None else torch.device(device_type or "cpu")
        self.tensor = self.tensor.to(device)
        return self

    @staticmethod
    def stack(items: list[DistTensorData]) -> DistTensorData:
        """The samples' tensors stacked on a new batch dim; they must agree in shape, sbp
        and placement."""
        if not items:
            raise ValueError("DistTensorData.stack of no samples")
        first = items[0]
        if not isinstance(first.tensor, torch.Tensor):
            raise TypeError(
                f"DistTensorData.tensor must be a torch.Tensor, got {type(first.tensor).__name__}"
                "; check what the dataset's __getitem__ returns"
            )
        for item in items[1:]:
            if item.tensor.shape != first.tensor.shape:
                raise ValueError(
                    f"samples of different shapes: {tuple(first.tensor.shape)} and "
                    f"{tuple(item.tensor.shape)} (pad them to one length in the dataset)"
                )
            if item.sbp_list != first.sbp_list or item.placement_idx != first.placement_idx:
                raise ValueError("samples with different sbp_list / placement_idx")
        return DistTensorData(
            torch.stack([i.tensor for i in items]), list(first.sbp_list), first.placement_idx
        )


class Instance:
    """Named fields of a sample (``instance.input_ids``, ``instance.get("labels")``)."""

    def __init__(self, **fields):
        self._fields = OrderedDict()
        for name, value in fields.items():
            self.set(name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self.set(name, value)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._fields:
            raise AttributeError(f"Cannot find field '{name}' in the given Instance!")
        return self._fields[name]

    def set(self, name: str, value: Any) -> None:
        self._fields[name] = value

    def has(self, name: str) -> bool:
        return name in self._fields

    def remove(self, name: str) -> None:
        del self._fields[name]

    def get(self, name: str):
        return self._fields[name]

    def get_fields(self) -> OrderedDict:
        return self._fields

    def __len__(self) -> int:
        return len(self._fields)

    def __iter__(self):
        raise NotImplementedError("`Instance` object is not iterable!")

    @staticmethod
    def stack(instances: list[Instance]) -> Instance:
        """One ``Instance`` of batched fields: tensors stacked, ``DistTensorData`` by its
        ``stack``, lists kept as the list of the samples' values."""
        if not instances or not all(isinstance(i, Instance) for i in instances):
            raise ValueError("Instance.stack needs a non-empty list of Instances")
        out = Instance()
        for name in instances[0].get_fields():
            values = [i.get(name) for i in instances]
            first = values[0]
            if isinstance(first, torch.Tensor):
                out.set(name, torch.stack(values))
            elif isinstance(first, list):
                out.set(name, values)
            elif hasattr(type(first), "stack"):
                out.set(name, type(first).stack(values))
            else:
                raise ValueError(f"Unsupported type {type(first).__name__} for stack ({name})")
        return out

    def to_dict(self) -> dict:
        """The fields as a batch dict: ``DistTensorData`` unwrapped to its tensor."""
        return {
            k: (v.tensor if isinstance(v, DistTensorData) else v) for k, v in self._fields.items()
        }

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v}" for k, v in self._fields.items())
        return f"Instance(fields=[{fields}])"
