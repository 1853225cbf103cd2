"""The FleetX front door on FleetX's own example (projects/simple_net): a plain network in a
task module trains, evaluates, predicts, saves, resumes exactly, exports ONNX that
onnxruntime matches, and calls its hooks in the documented order."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from engine_helpers import SIMPLE_NET, RecordingModule, make_engine, run_tool, simple_cfg
from train_net_helpers import read_metrics

from libai.checkpoint.checkpointer import Checkpointer
from libai.fleetx.yaml_config import load_yaml_config


def test_simple_net_trains_evaluates_predicts_and_writes_the_run(tmp_path):
    engine = make_engine(
        simple_cfg(tmp_path / "run", "Engine.max_steps=40", "Data.Train.dataset.num_samples=640")
    )
    first = engine.evaluate()["loss"]
    engine.fit()
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == list(range(40))
    assert metrics[39]["total_loss"] < 0.85 * metrics[0]["total_loss"]
    assert "eval_loss" in metrics[3] and "eval_acc" in metrics[39]
    after = engine.evaluate()
    assert after["loss"] < first and 0.0 <= after["acc"] <= 1.0
    assert engine.predict()["loss"] > 0
    # the run's outputs: the resolved config loads back, checkpoints, curves
    out = tmp_path / "run"
    again = load_yaml_config(out / "config.yaml")
    assert again.Engine.accumulate_steps == 2 and again.Global.local_batch_size == 16
    assert again.Model.module == "projects.simple_net.module.SimpleNetModule"
    assert (out / "model_final" / ".metadata").is_file() and (out / "loss_curve.png").is_file()
    assert (out / "model_0000019").is_dir()  # save_steps=20
    assert list((out / "tensorboard").iterdir())


def test_log_dicts_carry_fleetx_keys(tmp_path):
    engine = make_engine(simple_cfg(tmp_path, "Engine.logging_freq=2"), module_cls=RecordingModule)
    engine.fit()
    logs = [p for name, p in engine.module.calls if name == "training_step_end"]
    assert [(d["epoch"], d["batch"]) for d in logs] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    keys = {
        "epoch",
        "total_epoch",
        "batch",
        "total_batch",
        "total_step",
        "loss",
        "lr",
        "train_cost",
    }
    assert all(set(d) == keys for d in logs)
    losses = [v for v, _ in engine.trainer.storage.history("total_loss").values()]
    assert logs[0]["loss"] == pytest.approx((losses[0] + losses[1]) / 2)
    assert logs[1]["lr"] == read_metrics(tmp_path)[3]["lr"] and logs[0]["total_step"] == 8
    assert logs[0]["total_batch"] == 2 and logs[0]["total_epoch"] == 4
    epochs = [p for name, p in engine.module.calls if name == "training_epoch_end"]
    assert [d["epoch"] for d in epochs] == [0, 1, 2, 3] and all(d["train_cost"] > 0 for d in epochs)
    # each epoch's loss: the mean of its 2 steps' losses
    for k, d in enumerate(epochs):
        assert d["loss"] == pytest.approx((losses[2 * k] + losses[2 * k + 1]) / 2)


def test_hooks_are_called_in_the_documented_order(tmp_path):
    """4 steps of 2 micro-batches, 2 steps per epoch, logging every 2, evaluation every 2
    steps over 1 batch, then a test pass over 1 batch and one inference call."""
    cfg = simple_cfg(
        tmp_path,
        "Engine.max_steps=4",
        "Engine.logging_freq=2",
        "Engine.eval_freq=2",
        "Engine.eval_iters=1",
        "Engine.test_iters=1",
    )
    engine = make_engine(cfg, module_cls=RecordingModule)
    calls = engine.module.calls
    assert [n for n, _ in calls] == ["get_model", "get_loss_fn", "configure_optimizers"]
    calls.clear()
    engine.fit()
    step = ["pretreating_batch", *["training_step", "backward"] * 2]
    evaluation = ["pretreating_batch", "validation_step", "validation_epoch_end"]
    want = [
        *step,
        *step,
        "training_step_end",
        "training_epoch_end",
        *evaluation,  # eval_freq=2: after step 2 (the one at step 4 is the final one)
        *step,
        *step,
        "training_step_end",
        "training_epoch_end",
        *evaluation,
    ]
    assert [n for n, _ in calls] == want
    calls.clear()
    engine.predict()  # the default test_step is the validation step
    assert [n for n, _ in calls] == ["pretreating_batch", "test_step", "validation_step"]
    # logging_freq=1: the *_end hooks of the eval / test loops, with their log_dicts
    engine.cfg.Engine.logging_freq = 1
    calls.clear()
    started = time.perf_counter()
    engine.evaluate(epoch=3)
    elapsed = time.perf_counter() - started
    (end,) = [p for n, p in calls if n == "validation_step_end"]
    assert set(end) == {"loss", "epoch", "batch", "total_batch", "eval_cost"} and end["epoch"] == 3
    # FleetX's eval_cost: seconds per batch so far, within the pass's own time
    assert 0 < end["eval_cost"] * (end["batch"] + 1) <= elapsed
    (epoch_end,) = [p for n, p in calls if n == "validation_epoch_end"]
    assert epoch_end["sums"]["count"] == 16 and epoch_end["total_batch"] == 1
    calls.clear()
    started = time.perf_counter()
    engine.predict()
    elapsed = time.perf_counter() - started
    assert [n for n, _ in calls] == [
        "pretreating_batch",
        "test_step",
        "validation_step",
        "test_step_end",
    ]
    (end,) = [p for n, p in calls if n == "test_step_end"]
    assert 0 < end["test_cost"] * (end["batch"] + 1) <= elapsed


def test_inference_eager_and_from_the_exported_onnx_graph(tmp_path):
    make_engine(simple_cfg(tmp_path / "run", "Engine.max_steps=4")).fit()
    ckpt = f"Engine.save_load.ckpt_dir={tmp_path / 'run'}"
    exporter = make_engine(simple_cfg(tmp_path / "x", ckpt), mode="export")
    exporter.load()
    checks = exporter.export()
    assert checks["model.onnx"].ok() and checks["model.onnx"].max_abs_diff < 1e-4
    onnx_dir = tmp_path / "x"  # FleetX's layout: x/rank_0/model.onnx
    assert (onnx_dir / "rank_0" / "model.onnx").is_file()
    eager = make_engine(
        simple_cfg(tmp_path / "e", ckpt), mode="inference", module_cls=RecordingModule
    )
    eager.load()
    deployed = make_engine(
        simple_cfg(tmp_path / "d", f"Inference.model_dir={onnx_dir}"),
        mode="inference",
        module_cls=RecordingModule,
    )
    batch = next(iter(eager.test_loader))
    probs = eager.inference(batch)
    logits = deployed.inference(batch)["output"]
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(logits), -1), probs, atol=1e-5)
    assert [n for n, _ in eager.module.calls[-3:]] == [
        "pretreating_batch",
        "predict_step",
        "predict_step_end",
    ]
    assert deployed.module.calls[-1][0] == "inference_end"
    with pytest.raises(RuntimeError, match="needs mode='train'"):
        deployed.fit()


def test_resume_after_a_kill_gives_the_same_losses_bitwise(tmp_path):
    """A run SIGKILLed at step 13 resumes from its step-9 checkpoint (RNG, data position,
    optimizer, LR schedule) and logs exactly the losses of an uninterrupted run."""
    common = [
        *[o for o in simple_cfg_overrides()],
        "Engine.max_steps=20",
        "Engine.num_train_epochs=10",
        "Engine.save_load.save_steps=5",
        "Engine.eval_freq=-1",
        "Model.module=engine_helpers.KillAtStepModule",
        "+Model.kill_at_step=-1",
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_tool("train", SIMPLE_NET, *common, f"Engine.save_load.output_dir={straight}")
    proc = run_tool(
        "train",
        SIMPLE_NET,
        *common,
        f"Engine.save_load.output_dir={killed}",
        "Model.kill_at_step=13",
        check=False,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (killed / "last_checkpoint").read_text().strip() == "model_0000009"
    run_tool(
        "train",
        SIMPLE_NET,
        *common,
        f"Engine.save_load.output_dir={killed}",
        f"Engine.save_load.ckpt_dir={killed}",
    )
    a, b = read_metrics(straight), read_metrics(killed)
    assert sorted(b) == list(range(20))
    for i in range(20):
        assert a[i]["total_loss"] == b[i]["total_loss"], (i, a[i], b[i])
        assert a[i]["lr"] == b[i]["lr"]
    extra = Checkpointer(torch.nn.Linear(1, 1), str(killed)).get_checkpoint_file()
    assert extra.endswith("model_final")


def simple_cfg_overrides():
    from engine_helpers import SMALL

    return [o for o in SMALL if not o.startswith("Engine.max_steps")]


def test_the_run_config_is_saved_resolved(tmp_path):
    engine = make_engine(simple_cfg(tmp_path, "Engine.max_steps=2"))
    saved = (tmp_path / "config.yaml").read_text()
    assert "${" not in saved  # interpolations resolved
    assert engine.cfg.Data.Train.dataset.image_size == 32
    assert json.loads(json.dumps(engine.train_cfg.dist.data_parallel_size)) == 1


def test_engine_save_after_fit_resumes_where_the_straight_run_goes_on(tmp_path):
    """``Engine.save()`` after ``fit`` of 3 steps writes ``model_0000002`` (the last step
    done); an Engine loading it starts at step 3 with 3 x 16 samples consumed, and its fit to
    5 steps ends on the weights a straight 5-step run ends on, bitwise (one LR schedule of
    5 steps for all three)."""

    def engine(name, steps):
        return make_engine(
            simple_cfg(tmp_path / name, f"Engine.max_steps={steps}", "+Optimizer.lr.decay_steps=5")
        )

    straight = engine("straight", 5)
    straight.fit()
    first = engine("first", 3)
    first.fit()
    path = first.save()
    assert path == str(tmp_path / "first" / "model_0000002")
    second = engine("second", 5)
    point = second.load(path)
    assert tuple(point) == (3, 48)
    second.fit()
    want = straight.module.model.state_dict()
    for name, value in second.module.model.state_dict().items():
        assert torch.equal(value, want[name]), name


class _OwnOptimizerModule(RecordingModule):
    """configure_optimizers returns its own (optimizer, scheduler) pair, as FleetX allows."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)


def test_a_modules_own_optimizer_and_scheduler_run_the_steps(tmp_path):
    """The pair a module's ``configure_optimizers`` returns replaces the YAML's Optimizer:
    SGD steps with the LambdaLR's 0.1 x 0.5**k at step k (metrics.json), not AdamW's cosine."""
    engine = make_engine(simple_cfg(tmp_path, "Engine.max_steps=3"), module_cls=_OwnOptimizerModule)
    engine.fit()
    groups = engine.optimizer.param_groups
    assert "momentum" in groups[0] and "betas" not in groups[0]  # SGD's, not AdamW's
    lrs = [read_metrics(tmp_path)[k]["lr"] for k in range(3)]
    assert lrs == pytest.approx([0.1, 0.05, 0.025])
