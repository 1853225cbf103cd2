"""``ZeroOptimizer.state_dict`` / ``load_state_dict`` (the ``torch.optim`` API, same layout
only) in one process: a loaded state continues as torch's AdamW would, DTensor states come
back as DTensors, and a state of another layout or model, or of a plain optimizer, is a
clear error."""

from __future__ import annotations

import copy

import pytest
import torch
from layer_helpers import single_process  # noqa: F401  (autouse fixture)
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from libai import dist
from libai.runtime.zero import ZeroOptimizer

STEPS = 3


def make_model(dtensor: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    if dtensor:  # the first weight as a replicated DTensor on the one-rank tp mesh
        mesh = dist.get_dist_util().mesh["tp"]
        weight = distribute_tensor(model[0].weight.detach(), mesh, [Replicate()])
        model[0].weight = nn.Parameter(weight)
    return model


def grads(step: int, model: nn.Module) -> None:
    """Fixed gradients of step ``step`` (the same for every copy of the model)."""
    g = torch.Generator().manual_seed(step)
    for p in model.parameters():
        value = torch.randn(p.shape, generator=g)
        if isinstance(p, DTensor):
            value = distribute_tensor(value, p.device_mesh, p.placements)
        p.grad = value


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)


def plain(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


@pytest.mark.parametrize("dtensor", [False, True], ids=["tensors", "dtensors"])
def test_a_loaded_state_continues_as_torchs_adamw(dtensor):
    reference = make_model(dtensor)
    reference_opt = adamw(reference)
    model = make_model(dtensor)
    optimizer = ZeroOptimizer(adamw(model), model, stage=1)
    for step in range(STEPS - 1):
        for m, opt in ((reference, reference_opt), (model, optimizer)):
            grads(step, m)
            opt.step()
    saved = optimizer.state_dict()

    resumed = copy.deepcopy(model)
    resumed_opt = ZeroOptimizer(adamw(resumed), resumed, stage=1)
    resumed_opt.load_state_dict(saved)
    first = resumed_opt.state[resumed_opt.param_groups[0]["params"][0]]
    assert isinstance(first["exp_avg"], DTensor) == dtensor
    for m, opt in ((reference, reference_opt), (resumed, resumed_opt)):
        grads(STEPS - 1, m)
        opt.step()
    for (name, want), got in zip(reference.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(plain(got), plain(want), rtol=1e-6, atol=1e-7, msg=name)


def test_a_state_of_another_layout_or_model_or_optimizer_is_a_clear_error():
    model = make_model()
    optimizer = ZeroOptimizer(adamw(model), model, stage=1)
    grads(0, model)
    optimizer.step()
    saved = optimizer.state_dict()

    other_rank = copy.deepcopy(saved)
    other_rank["zero"]["dp_rank"] = 1  # the same parameters, saved by another dp rank
    other_model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2))
    other_params = ZeroOptimizer(adamw(other_model), other_model, stage=1).state_dict()
    for bad in (other_rank, other_params):
        fresh = make_model()
        with pytest.raises(ValueError, match="saved on another layout or model"):
            ZeroOptimizer(adamw(fresh), fresh, stage=1).load_state_dict(bad)
    fresh = make_model()
    # a plain optimizer's state, and no state at all (a checkpoint saved without one)
    for bad in (adamw(model).state_dict(), None, []):
        with pytest.raises(ValueError, match="not a ZeroOptimizer state dict"):
            ZeroOptimizer(adamw(fresh), fresh, stage=1).load_state_dict(bad)
