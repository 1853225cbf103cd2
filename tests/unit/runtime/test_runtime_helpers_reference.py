"""Small pieces of the runtime against hand-derived answers or torch itself: gradient
buckets, moving a nested batch, whole-number floats in a run spec, the step a door builds
(clipping from the optimizer's groups, the batch transform) and the sequence length the
memory estimator reads from a config."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from layer_helpers import single_process  # noqa: F401  (autouse fixture)
from master_weights_cases import GPT

from libai.models import GPTForPreTraining
from libai.runtime.buckets import bucket_tensors
from libai.runtime.core import build_step, parallelize
from libai.runtime.spec import DistSpec, RunSpec
from libai.runtime.trainer import to_device


def test_buckets_keep_order_split_at_the_size_and_never_mix_dtypes():
    f32 = [torch.zeros(4), torch.zeros(4), torch.zeros(4)]  # 16 bytes each
    f16 = [torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)]
    tensors = [f32[0], f32[1], f16[0], f16[1], f32[2]]
    got = list(bucket_tensors(tensors, bucket_bytes=32))
    # 32 bytes: two fp32 tensors fill a bucket; the dtype changes close the next ones
    assert [[id(t) for t in b] for b in got] == [
        [id(f32[0]), id(f32[1])],
        [id(f16[0]), id(f16[1])],
        [id(f32[2])],
    ]
    # one tensor larger than a bucket still gets a bucket of its own
    assert [len(b) for b in bucket_tensors([torch.zeros(100), torch.zeros(1)], 32)] == [1, 1]


def test_to_device_moves_every_tensor_of_a_nested_batch():
    batch = {
        "input_ids": torch.ones(2, 3),
        "pair": (torch.ones(1), [torch.ones(2), "text"]),
        "count": 3,
    }
    moved = to_device(batch, torch.device("meta"))
    assert moved["input_ids"].is_meta and moved["count"] == 3
    first, (second, text) = moved["pair"]
    assert isinstance(moved["pair"], tuple) and first.is_meta and second.is_meta
    assert text == "text"


def test_whole_number_floats_become_ints_and_others_are_named_errors():
    spec = RunSpec.from_config({"train_iter": 1e3, "checkpointer": {"period": 2.0}})
    assert (spec.train_iter, spec.checkpointer.period) == (1000, 2)
    assert type(spec.train_iter) is int and type(spec.checkpointer.period) is int
    spec = RunSpec.from_config({"warmup_ratio": 1.0})  # a float field keeps its float
    assert type(spec.warmup_ratio) is float
    with pytest.raises(ValueError, match=r"train\.train_iter: Value '1\.5' of type 'float'"):
        RunSpec.from_config({"train_iter": 1.5})


def test_the_door_step_clips_by_the_optimizers_groups_and_transforms_each_batch():
    """One step of :func:`build_step` against torch: the loss of the transformed batch,
    ``clip_grad_norm_`` to the ``clip_grad_max_norm`` the optimizer's group holds, SGD."""
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    reference = copy.deepcopy(model)
    spec = RunSpec(global_batch_size=2, train_micro_batch_size=2, num_accumulation_steps=1)
    parts = parallelize(model, spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer.param_groups[0]["clip_grad_max_norm"] = 0.05
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, GPT["vocab_size"], (2, 9), generator=g)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}

    def reverse(b):  # the labels read right to left: a loss the plain batch does not give
        return {**b, "labels": b["labels"].flip(1).contiguous()}

    step = build_step(parts, spec, [batch], optimizer, None, batch_transform=reverse)
    step.train(0, 1)

    out = reference(**reverse(batch))
    sum(v for k, v in out.items() if "loss" in k).backward()
    norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.05)
    assert norm > 0.05  # the clip acts
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    for (name, want), got in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_the_estimators_sequence_length_falls_back_to_max_position_embeddings():
    """Llama's config names ``max_position_embeddings`` and no ``max_seq_length``: the
    estimate uses it; without either the estimate asks for ``--seq-length``."""
    from libai.config import LazyConfig
    from libai.runtime.memory_estimator import estimate_config

    def load(overrides):
        path = Path(__file__).resolve().parents[3] / "configs" / "llama_sft.py"
        return LazyConfig.apply_overrides(LazyConfig.load(str(path)), overrides)

    tiny = [
        "model.cfg.hidden_layers=1",
        "model.cfg.hidden_size=32",
        "model.cfg.num_attention_heads=4",
        "model.cfg.num_key_value_heads=4",
        "model.cfg.intermediate_size=64",
        "model.cfg.vocab_size=99",
        "tokenization.setup=False",
        "train.train_micro_batch_size=2",
    ]
    settings = estimate_config(load([*tiny, "model.cfg.max_position_embeddings=24"]))[1]
    assert settings.seq_length == 24
    assert estimate_config(load(tiny), seq_length=8)[1].seq_length == 8  # the flag wins
    with pytest.raises(ValueError, match="no model.cfg.max_seq_length: pass --seq-length"):
        estimate_config(load([*tiny, "~model.cfg.max_position_embeddings"]))


def test_custom_autocast_lists_need_an_amp_dtype():
    from libai.runtime.amp_lists import AutocastOpLists
    from libai.runtime.parallel import ModelRunner

    lists = AutocastOpLists(black=["matmul"])
    with pytest.raises(ValueError, match="custom autocast op lists need mixed precision"):
        ModelRunner(GPTForPreTraining(**GPT), autocast_op_lists=lists)
    runner = ModelRunner(
        GPTForPreTraining(**GPT), amp_dtype=torch.bfloat16, autocast_op_lists=lists
    )
    assert runner.autocast_op_lists is lists
    # empty lists are no lists: accepted without amp, and dropped
    assert (
        ModelRunner(GPTForPreTraining(**GPT), autocast_op_lists=AutocastOpLists()).autocast_op_lists
        is None
    )


def test_parallelize_hands_the_runner_the_specs_schedule():
    from libai import dist

    assert dist.get_dist_util().layout.pipeline_schedule != "GPipe"
    for schedule in ("GPipe", "Interleaved1F1B"):
        spec = RunSpec(num_accumulation_steps=1, dist={"pipeline_schedule": schedule})
        assert spec.dist == DistSpec(pipeline_schedule=schedule)  # the mapping, typed
        assert parallelize(GPTForPreTraining(**GPT), spec).runner.schedule_name == schedule


def test_a_loaded_loss_scaler_grows_and_backs_off_where_the_saved_one_would():
    """A scaler state saved after 3 clean steps of 4 (and one overflow before): the loaded
    scaler doubles the scale after one more clean step, as torch's GradScaler counts."""
    from libai.runtime.amp import DynamicLossScaler

    saved = DynamicLossScaler(init_scale=64.0, growth_interval=4)
    for found_inf in (True, False, False, False):
        saved.update(found_inf)
    assert (saved.scale, saved.good_steps, saved.skipped_steps) == (32.0, 3, 1)
    loaded = DynamicLossScaler(init_scale=1.0, growth_interval=4)
    loaded.load_state_dict(saved.state_dict())
    assert loaded.state_dict() == {"scale": 32.0, "good_steps": 3, "skipped_steps": 1}
    loaded.update(False)
    assert loaded.scale == 64.0
    # a state from before skipped steps were counted loads with none
    old = DynamicLossScaler()
    old.load_state_dict({"scale": 8.0, "good_steps": 2})
    assert (old.scale, old.good_steps, old.skipped_steps) == (8.0, 2, 0)


def test_train_step_is_one_step_of_the_runner_with_the_optimizer():
    """``libai.engine.train_step`` (the earlier releases' name): forward, backward and the
    optimizer's step, against the same step written with torch."""
    from libai.engine import train_step
    from libai.runtime.parallel import ModelRunner

    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, GPT["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
    loss = train_step(ModelRunner(model), batch, torch.optim.SGD(model.parameters(), lr=0.5))

    want = reference(**batch)["lm_loss"]
    want.backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    assert loss == pytest.approx(float(want), rel=1e-6)
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
