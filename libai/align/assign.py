"""``assign_weight``: copy one model's weights into another by the comparison-key mapping."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from libai.align.name_map import apply_rename, loader_rules
from libai.align.params import param_entries


class DictReader:
    """The reader interface of :class:`~libai.models.utils.hf_io.CheckpointReader` over an
    in-memory ``{name: tensor}`` (another model's weights)."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: str = "<base model>"):
        self.tensors, self.path = tensors, path
        self.weight_map = dict.fromkeys(tensors, path)

    def keys(self):
        return self.tensors.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors[name].dtype

    def read(self, name: str, dim=None, start=0, stop=None) -> torch.Tensor:
        t = self.tensors[name]
        if dim is None:
            return t
        stop = t.shape[dim] if stop is None else stop
        return t.narrow(dim, start, stop - start)


def _recorder_parts(model):
    """(module, loader rules, user rename rules) of a module or a recorder."""
    from libai.align.recorder import ModelRecorder

    if isinstance(model, ModelRecorder):
        return model.model, model._rules, model._user_rename
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module or a recorder, got {type(model).__name__}")
    return model, loader_rules(model), []


@torch.no_grad()
def assign_weight(base_model, raw_model) -> int:
    """Copy ``base_model``'s weights into ``raw_model`` (modules or recorders); returns the
    number of parameters written.

    Both sides are keyed as in the dumps: a libai model with a Hugging Face loader through its
    weight rules (fused q/k/v, transposes, vocabulary padding, this rank's tp shard), anything
    else by parameter name after its rename rules. Every parameter of ``raw_model`` must find
    a source of the right shape; otherwise nothing is written and the error names them all.
    Collective when either model has DTensor parameters.
    """
    base, base_rules, base_rename = _recorder_parts(base_model)
    raw, raw_rules, raw_rename = _recorder_parts(raw_model)
    source = {e.key: e.value for e in param_entries(base, base_rules, base_rename)}
    if raw_rules is not None:
        from libai.models.utils import loader_for_model
        from libai.models.utils.model_loader.base_loader import load_weights

        loader = loader_for_model(raw)
        load_weights(
            raw,
            DictReader(source),
            list(raw_rules.values()),
            prefix=loader.base_model_prefix,
        )
        return len(raw_rules)
    targets, problems = [], []
    for name, p in raw.named_parameters():
        if p.is_meta:
            continue
        key = apply_rename(name, raw_rename)
        value = source.get(key)
        if value is None:
            problems.append(f"{name} (key {key!r}) has no source in {type(base).__name__}")
        elif tuple(value.shape) != tuple(p.shape):
            problems.append(f"{name}: shape {list(p.shape)} vs source {key} {list(value.shape)}")
        else:
            targets.append((p, value))
    if problems:
        raise ValueError("assign_weight cannot copy: " + "; ".join(problems))
    for p, value in targets:
        value = value.to(dtype=p.dtype, device=p.device)
        if isinstance(p, DTensor):
            value = distribute_tensor(value, p.device_mesh, p.placements)
        p.copy_(value)
    return len(targets)
