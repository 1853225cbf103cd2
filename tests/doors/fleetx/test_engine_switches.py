"""Every switch of the YAML applied to a plain nn.Module (FleetX's SimpleNet) through the
Engine: mixed precision and its custom op lists, the fp16 loss scaler, recompute, compile,
and data parallel with ZeRO stages 1-3 (Distributed.sharding) on 2 ranks."""

from __future__ import annotations

import json

import pytest
import torch
from door_memory import check_zero_holdings
from engine_helpers import RecordingModule, make_engine, simple_cfg
from launch import torchrun

from libai.runtime.trainer import to_device

AMP = ["Engine.mix_precision.enable=true", "Engine.mix_precision.dtype=bfloat16"]


def head_output_dtypes(engine, steps=1) -> set:
    seen = set()
    handle = engine.runner.model.head.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
    try:
        batch = to_device(next(iter(engine.train_loader)), engine.util.device)
        for _ in range(steps):
            engine.runner.train_step(batch, engine.optimizer)
    finally:
        handle.remove()
    return seen


def test_bf16_autocast_and_custom_op_lists(tmp_path):
    assert head_output_dtypes(make_engine(simple_cfg(tmp_path / "fp32"))) == {torch.float32}
    assert head_output_dtypes(make_engine(simple_cfg(tmp_path / "bf16", *AMP))) == {torch.bfloat16}
    # FleetX's Paddle name for the Linear's matmul keeps it in float32 under autocast
    black = make_engine(
        simple_cfg(tmp_path / "black", *AMP, "Engine.mix_precision.custom_black_list=[matmul_v2]")
    )
    assert head_output_dtypes(black) == {torch.float32}
    engine = make_engine(simple_cfg(tmp_path / "run", *AMP, "Engine.max_steps=4"))
    engine.fit()
    assert engine.runner.amp_dtype == torch.bfloat16 and engine.runner.loss_scaler is None


def test_fp16_overflow_skips_the_step_and_the_lr(tmp_path):
    cfg = simple_cfg(
        tmp_path,
        "Engine.mix_precision.enable=true",
        "Engine.mix_precision.dtype=float16",
        "Engine.mix_precision.scale_loss=1e30",  # the first steps overflow
        "Engine.max_steps=2",
    )
    engine = make_engine(cfg, module_cls=RecordingModule)
    before = {n: p.detach().clone() for n, p in engine.runner.model.named_parameters()}
    engine.fit()
    logs = [p for n, p in engine.module.calls if n == "training_step_end"]
    assert [d["found_inf"] for d in logs] == [True, True]
    assert logs[1]["loss_scale"] == 0.25e30
    assert engine.lr_scheduler.last_epoch == 0  # an overflow step does not advance the LR
    for name, p in engine.runner.model.named_parameters():
        assert torch.equal(p, before[name]), name


def saved_bytes_and_grads(engine):
    batch = to_device(next(iter(engine.train_loader)), engine.util.device)
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine.runner.forward_backward(batch)
    return total[0], {n: p.grad.clone() for n, p in engine.runner.model.named_parameters()}


def test_recompute_keeps_gradients_and_saves_less(tmp_path):
    common = ("Model.dropout=0.0", "Model.hidden_size=128")
    plain_bytes, plain = saved_bytes_and_grads(make_engine(simple_cfg(tmp_path / "a", *common)))
    engine = make_engine(simple_cfg(tmp_path / "b", *common, "Model.use_recompute=true"))
    ckpt_bytes, ckpt = saved_bytes_and_grads(engine)
    assert ckpt_bytes < 0.6 * plain_bytes, (ckpt_bytes, plain_bytes)
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, rtol=0, atol=1e-6, msg=name)


def test_compile_blocks_and_keep_the_losses(tmp_path):
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["Engine.compile=true"])):
        # dropout off: compiled graphs draw their random masks differently
        cfg = simple_cfg(tmp_path / name, "Engine.max_steps=3", "Model.dropout=0.0", *extra)
        engine = make_engine(cfg)
        engine.fit()
        runs[name] = [v for v, _ in engine.trainer.storage.history("total_loss").values()]
        if extra:  # every block compiled in place: names unchanged
            model = engine.runner.model  # the stack of Blocks; embed and head stay eager
            assert all(b._compiled_call_impl is not None for b in model.blocks)
            assert model.head._compiled_call_impl is None
    assert runs["compiled"] == pytest.approx(runs["eager"], abs=1e-5)


def test_data_parallel_and_zero_stages_on_2_ranks(tmp_path):
    """Distributed.dp_degree=2 and sharding_degree=2 x sharding_stage 1/2/3 on 2 ranks: the
    losses of every step and the evaluation loss equal one process on the same global
    batches, and each stage changes what a rank holds (measured from the tensors)."""
    sharding = "Distributed.sharding.sharding_degree=2"
    layouts = {
        "dp2": [],
        **{
            f"zero{s}": [
                "Distributed.dp_degree=1",
                sharding,
                f"Distributed.sharding.sharding_stage={s}",
            ]
            for s in (1, 2, 3)
        },
    }
    results = torchrun("engine_layouts.py", 2, json.dumps(layouts))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    single = make_engine(simple_cfg(tmp_path / "one", "Model.dropout=0.0", "Engine.eval_freq=-1"))
    single.fit()
    one = [v for v, _ in single.trainer.storage.history("total_loss").values()]
    one_eval = single.evaluate()["loss"]
    assert len(one) == 8
    for name in layouts:
        for r in results:
            # the same global batches as one process: the same losses at every step and the
            # same evaluation loss, up to fp32 rounding (measured: 1.2e-7 after 8 AdamW steps)
            assert r[name]["losses"] == pytest.approx(one, abs=1e-5), name
            assert r[name]["eval"] == pytest.approx(one_eval, abs=1e-5), name
    plain = [r["dp2"] for r in results]
    for stage in (1, 2, 3):
        runs = [r[f"zero{stage}"] for r in results]
        # same layout and kernels: ZeRO only changes which rank updates what
        for run, base in zip(runs, plain):
            assert run["losses"] == pytest.approx(base["losses"], abs=1e-6), stage
        check_zero_holdings(plain, stage, runs)
