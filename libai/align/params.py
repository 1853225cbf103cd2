"""Parameters and their gradients as compared: whole tensors under comparison keys.

A libai model with a Hugging Face loader is exported through its weight rules (Hugging Face
names and layouts, see :mod:`libai.align.name_map`); any other model by its own parameter
names after the rename rules. Tensor-parallel parameters (DTensors) are gathered, so every
rank of a stage must call :func:`param_entries` (a collective of the stage's mesh); a tied
copy of another stage's parameter is left out, as in ``save_huggingface``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from libai.align import dump_format as fmt
from libai.align import layouts
from libai.align.name_map import RenameRules, apply_rename
from libai.models.utils.hf_export import full_value
from libai.models.utils.weight_mapping import Rule


@dataclass
class ParamEntry:
    """One compared tensor: ``key``, the parameter ``name`` it comes from, its value and
    gradient (whole, on CPU) and the layout the parameter had."""

    key: str
    name: str
    value: torch.Tensor
    grad: torch.Tensor | None
    placements: list[str] | None
    mesh: dict | None

    def describe(self) -> dict:
        return {
            "name": self.name,
            "key": self.key,
            "shape": list(self.value.shape),
            "dtype": fmt.dtype_name(self.value.dtype),
            "stats": fmt.tensor_stats(self.value),
            "grad_stats": None if self.grad is None else fmt.tensor_stats(self.grad),
            "placements": self.placements,
            "mesh": self.mesh,
        }


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().clone()


def param_entries(
    model: nn.Module, rules: dict[str, Rule] | None, rename: RenameRules = ()
) -> list[ParamEntry]:
    """Every compared tensor of ``model`` in parameter order (first key wins)."""
    entries: dict[str, ParamEntry] = {}
    for name, p in model.named_parameters(remove_duplicate=rules is None):
        if p.is_meta or getattr(p, "libai_tied_copy", False):
            continue
        placements, mesh = layouts.describe(p, None)
        value = full_value(p)
        grad = None if p.grad is None else full_value(p.grad, p)
        if rules is not None:
            values = rules[name].export(value)
            grads = rules[name].export(grad) if grad is not None else {}
        else:
            values, grads = {name: value}, {name: grad}
        for hf_name, v in values.items():
            key = apply_rename(hf_name, rename)
            if key in entries:
                continue
            g = grads.get(hf_name)
            entries[key] = ParamEntry(
                key, name, _cpu(v), None if g is None else _cpu(g), placements, mesh
            )
    return list(entries.values())
