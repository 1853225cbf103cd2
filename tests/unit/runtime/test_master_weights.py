"""Mixed precision level O2: low-precision parameters with fp32 master weights."""

from __future__ import annotations

import copy

import pytest
import torch
from master_weights_cases import GPT
from torch import nn

from libai import dist
from libai.checkpoint import Checkpointer
from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec, ZeroSpec


@pytest.fixture(autouse=True)
def single_process():
    dist.setup_dist_util({})


def make_model(seed=0):
    torch.manual_seed(seed)
    return GPTForPreTraining(**GPT)


def batches(n, batch=4, seq=12):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, GPT["vocab_size"], (batch, seq + 1), generator=g)
        out.append({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()})
    return out


def spec(level, dtype="bf16", zero_stage=None):
    zero = ZeroSpec(enabled=zero_stage is not None, stage=zero_stage or 1)
    amp = AmpSpec(enabled=True, dtype=dtype, level=level)
    return RunSpec(amp=amp, zero_optimization=zero, num_accumulation_steps=1)


def build(level, model=None, dtype="bf16"):
    model = model if model is not None else make_model()
    parts = parallelize(model, spec(level, dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return parts, shard_optimizer_for(parts, optimizer)


def train(parts, optimizer, data):
    losses = []
    for batch in data:
        losses.append(float(parts.runner.forward_backward(batch)))
        parts.runner.optimizer_step(optimizer, max_grad_norm=1.0)
    return losses


def test_o2_keeps_bf16_parameters_and_fp32_norms_and_masters():
    parts, optimizer = build("O2")
    model = parts.runner.model
    for name, p in model.named_parameters():
        want = torch.float32 if "norm" in name else torch.bfloat16
        assert p.dtype == want, name
    stepped = [p for g in optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in stepped)
    cast = {id(p) for p, _ in parts.runner.master_weights.pairs}
    assert not cast & {id(p) for p in stepped}  # the optimizer never sees a bf16 parameter


def test_o2_step_equals_adamw_on_fp32_masters_of_the_bf16_gradients():
    """An independent reference of one O2 step: a bf16 copy of the fp32 weights computes the
    gradients; torch's AdamW steps fp32 copies with those gradients in fp32; the O2 run's
    masters equal those copies and its parameters their bf16 rounding."""
    fp32 = make_model()
    reference = copy.deepcopy(fp32)
    parts, optimizer = build("O2", model=fp32)
    batch = batches(1)[0]
    train(parts, optimizer, [batch])

    low = copy.deepcopy(reference)
    for module in low.modules():
        if "norm" not in type(module).__name__.lower():
            for p in module.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    with torch.autocast("cpu", torch.bfloat16):
        out = low(**batch)
    sum(v for k, v in out.items() if "loss" in k).backward()
    start = dict(reference.named_parameters())  # the masters start from the fp32 weights
    masters = {n: start[n].detach().clone().requires_grad_() for n, _ in low.named_parameters()}
    for n, p in low.named_parameters():
        masters[n].grad = p.grad.float()
    torch.nn.utils.clip_grad_norm_(list(masters.values()), 1.0)
    torch.optim.AdamW(list(masters.values()), lr=1e-2, weight_decay=0.1).step()
    for n, p in low.named_parameters():  # the reference casts what O2 casts
        assert p.dtype == parts.runner.model.get_parameter(n).dtype, n
    by_name = dict(parts.runner.model.named_parameters())
    for n, master in masters.items():
        ours = by_name[n]
        if ours.dtype == torch.float32:  # a norm: stepped directly
            torch.testing.assert_close(ours.detach(), master.detach(), rtol=1e-6, atol=1e-7)
            continue
        got = parts.runner.master_weights._master_of[id(ours)]
        torch.testing.assert_close(got.detach(), master.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(ours.detach(), got.detach().to(torch.bfloat16)), n


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_o2_losses_follow_o1_within_low_precision_tolerance(dtype):
    """bf16, and fp16 with its loss scaler (unscaled on the fp32 master gradients)."""
    data = batches(1) * 6  # one batch, fitted: the loss falls
    o1 = train(*build("O1", dtype=dtype), data)
    o2 = train(*build("O2", dtype=dtype), data)
    assert o2 == pytest.approx(o1, rel=2e-2)
    assert o2[-1] < 0.9 * o2[0]  # and it learns as O1 does


def test_o2_state_bytes_are_lower_with_zero1_style_sharding_and_grads_half():
    """Per-parameter bytes after backward: O1 holds fp32 parameters and gradients, O2 bf16
    ones (the fp32 masters live with the optimizer state, which ZeRO shards over dp)."""

    def held(parts):
        model = parts.runner.model
        parts.runner.forward_backward(batches(1)[0])
        return sum(
            p.numel() * p.element_size() + p.grad.numel() * p.grad.element_size()
            for p in model.parameters()
        )

    o1, o2 = held(build("O1")[0]), held(build("O2")[0])
    norms = sum(p.numel() for n, p in make_model().named_parameters() if "norm" in n)
    total = sum(p.numel() for p in make_model().parameters())
    assert o1 == 8 * total
    assert o2 == 4 * (total - norms) + 8 * norms


def test_o2_checkpoint_holds_fp32_masters_and_resumes_exactly(tmp_path):
    data = batches(4)
    straight = train(*build("O2"), data)

    parts, optimizer = build("O2")
    train(parts, optimizer, data[:2])
    Checkpointer(parts.runner.model, str(tmp_path), optimizer=optimizer).save("model_0000001")
    # an fp32 run loads the O2 checkpoint's masters as its weights
    fp32 = make_model(seed=5)
    Checkpointer(fp32, str(tmp_path)).load(str(tmp_path / "model_0000001"), checkpointables=[])
    for n, p in fp32.named_parameters():
        ours = parts.runner.model.get_parameter(n)
        want = parts.runner.master_weights._master_of.get(id(ours), ours)
        assert torch.equal(p.detach(), want.detach()), n

    resumed_parts, resumed_opt = build("O2", model=make_model(seed=7))
    Checkpointer(resumed_parts.runner.model, str(tmp_path), optimizer=resumed_opt).load(
        str(tmp_path / "model_0000001")
    )
    assert train(resumed_parts, resumed_opt, data[2:]) == straight[2:]


def test_o2_with_zero_stage_3_is_a_clear_error():
    with pytest.raises(ValueError, match="O2 .* ZeRO stage 3"):
        parallelize(make_model(), spec("O2", zero_stage=3))
    with pytest.raises(ValueError, match="amp.level"):
        parallelize(make_model(), spec("O3"))


def test_o2_masters_a_low_precision_parameter_the_model_did_not_cast():
    """An optimizer may hold a bf16 parameter that is not the model's (a user's extra
    tensor): it gets an fp32 master from its own value, and the step rounds the master back
    into it, as SGD on that fp32 value computes."""
    from libai.runtime.master_weights import MasterWeights

    model = nn.Linear(3, 2)
    masters = MasterWeights(model, torch.bfloat16)
    masters.cast_model()
    extra = nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16))
    optimizer = torch.optim.SGD([*model.parameters(), extra], lr=0.25)
    masters.attach(optimizer)
    (stepped,) = [p for p in optimizer.param_groups[0]["params"] if p.shape == (3,)]
    assert stepped.dtype == torch.float32 and torch.equal(stepped, extra.float())
    grad = torch.tensor([1.0, 1.0, 2.0])
    extra.grad = grad.to(torch.bfloat16)
    masters.grads_to_master()
    optimizer.step()
    want = torch.tensor([1.0, -2.0, 0.5]) - 0.25 * grad
    assert torch.equal(stepped, want) and torch.equal(extra, want.to(torch.bfloat16))


def test_o2_cast_keeps_a_dtensor_parameters_object_flag_and_tags():
    """A DTensor parameter is cast by swapping contents: the same object, still a DTensor on
    its mesh and placements, bf16 with the fp32 value rounded as ``Tensor.to`` rounds it,
    frozen if it was frozen, trainable if it was, and with libai's tags."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from libai.runtime.master_weights import MasterWeights

    mesh = DeviceMesh("cpu", torch.zeros(1, dtype=torch.int), mesh_dim_names=("tp",))
    model = nn.Linear(4, 3)
    values = {"weight": torch.randn(3, 4) / 3, "bias": torch.randn(3) / 3}
    for name, value in values.items():
        p = nn.Parameter(distribute_tensor(value, mesh, [Shard(0)]), requires_grad=name == "bias")
        p.libai_tag = name
        setattr(model, name, p)
    before = {name: getattr(model, name) for name in values}
    MasterWeights(model, torch.bfloat16).cast_model()
    for name, value in values.items():
        p = getattr(model, name)
        assert p is before[name] and isinstance(p, DTensor) and p.placements == (Shard(0),)
        assert p.dtype == torch.bfloat16 and p.to_local().dtype == torch.bfloat16
        assert torch.equal(p.to_local(), value.to(torch.bfloat16))
        assert p.requires_grad == (name == "bias") and p.libai_tag == name
