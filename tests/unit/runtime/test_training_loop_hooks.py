"""The hooks :func:`libai.runtime.core.build_training_loop` registers, on a tiny GPT in one
process: periodic checkpoints carry the data position, evaluation runs every
``eval_period`` with the best checkpoint where the metric was best, the console shows the
step out of ``max_iter`` with the token rate, and a door's extra hooks run after the LR
schedule and before the checkpoint of the step. Expected values follow from the settings
(global batch 4, 6 steps, periods 2)."""

from __future__ import annotations

import json
import logging

import torch
from layer_helpers import single_process  # noqa: F401  (autouse fixture)
from master_weights_cases import GPT

from libai.models import GPTForPreTraining
from libai.runtime.core import build_checkpointer, build_training_loop, parallelize
from libai.runtime.hooks import HookBase
from libai.runtime.spec import CheckpointerSpec, EvaluationSpec, RunSpec

BATCH, SEQ, MAX_ITER = 4, 8, 6
#: the metric each evaluation returns, in order: evaluations after steps 1 and 3 (every 2
#: steps, before the last) and after the last step (5); the best ("max") is after step 3
SCORES = [1.0, 3.0, 2.0]


def batches():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, GPT["vocab_size"], (MAX_ITER, BATCH, SEQ + 1), generator=g)
    return [{"input_ids": t[:, :-1], "labels": t[:, 1:].contiguous()} for t in tokens]


def one_batch_spec(tmp_path, **settings) -> RunSpec:
    """A run writing under ``tmp_path`` whose step is one micro-batch of ``BATCH`` rows."""
    return RunSpec(
        output_dir=str(tmp_path),
        global_batch_size=BATCH,
        train_micro_batch_size=BATCH,
        num_accumulation_steps=1,
        **settings,
    )


class Recorder(HookBase):
    """Notes, after each step, the LR the schedule set and the checkpoints on disk."""

    def __init__(self, save_dir, optimizer):
        self.save_dir, self.optimizer, self.seen = save_dir, optimizer, []

    def after_step(self):
        saved = sorted(p.name for p in self.save_dir.glob("model_*"))
        self.seen.append((self.trainer.iter, self.optimizer.param_groups[0]["lr"], saved))


def test_hooks_of_the_loop_save_evaluate_and_log_as_configured(tmp_path, caplog):
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    spec = one_batch_spec(
        tmp_path,
        log_period=1,
        checkpointer=CheckpointerSpec(period=2, max_to_keep=None),
        evaluation=EvaluationSpec(
            enabled=True, eval_period=2, eval_metric="Score", eval_mode="max"
        ),
    )
    parts = parallelize(model, spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    save_dir = tmp_path / "ckpt"
    checkpointer = build_checkpointer(model, str(save_dir), optimizer, schedule)
    scores = iter(SCORES)
    evaluated_at = []

    def evaluate():
        evaluated_at.append(trainer.iter)
        return {"score": next(scores)}

    recorder = Recorder(save_dir, optimizer)
    trainer = build_training_loop(
        parts,
        spec,
        batches(),
        optimizer,
        schedule,
        checkpointer,
        max_iter=MAX_ITER,
        evaluate=evaluate,
        extra_hooks=[recorder],
        tokens_per_iter=BATCH * SEQ,
    )
    with caplog.at_level(logging.INFO, logger="libai.utils.events"):
        trainer.train(0, MAX_ITER)

    assert evaluated_at == [1, 3, MAX_ITER]
    # after the LR hook (step k's schedule already advanced), before step k's checkpoint
    assert [(i, lr) for i, lr, _ in recorder.seen] == [(i, 0.5 ** (i + 1)) for i in range(6)]
    # step 1's checkpoint and first best (score 1.0) are on disk at step 2, not at step 1
    assert recorder.seen[1][2] == [] and recorder.seen[2][2] == ["model_0000001", "model_best"]

    def extra(name):
        return json.loads((save_dir / name / "meta.json").read_text())["extra"]

    for iteration in (1, 3):
        assert extra(f"model_{iteration:07d}") == {
            "iteration": iteration,
            "consumed_train_samples": (iteration + 1) * BATCH,
        }
    assert extra("model_final") == {"iteration": 5, "consumed_train_samples": 6 * BATCH}
    assert extra("model_best") == {"iteration": 3, "consumed_train_samples": 4 * BATCH}

    lines = [r.getMessage() for r in caplog.records if "iteration: " in r.getMessage()]
    assert [line.split("iteration: ")[1].split()[0] for line in lines] == [
        f"{i}/{MAX_ITER}" for i in range(MAX_ITER)
    ]
    assert all("tokens/s: " in line for line in lines[1:])
    metrics = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [m["iteration"] for m in metrics if "score" in m] == [1, 3, 5]
    # one line per step (log_period 1): the last step's holds its scalars and the final
    # evaluation's, written once after it
    assert [m["iteration"] for m in metrics] == list(range(MAX_ITER))
    assert {"total_loss", "lr", "score"} <= set(metrics[-1])


def test_metrics_json_has_a_line_every_log_period_and_the_last_step(tmp_path):
    """log_period 4 over 6 steps, no evaluation: metrics.json has the lines of steps 3 (the
    4th) and 5 (the last), each once, with that step's loss."""
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    spec = one_batch_spec(
        tmp_path,
        log_period=4,
        checkpointer=CheckpointerSpec(period=100, max_to_keep=None),
        evaluation=EvaluationSpec(enabled=False),
    )
    parts = parallelize(model, spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    checkpointer = build_checkpointer(model, str(tmp_path / "ckpt"), optimizer, schedule)
    trainer = build_training_loop(
        parts, spec, batches(), optimizer, schedule, checkpointer, max_iter=MAX_ITER
    )
    trainer.train(0, MAX_ITER)
    losses = [v for v, _ in trainer.storage.history("total_loss").values()]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [3, 5]
    assert [m["total_loss"] for m in metrics] == [losses[3], losses[5]]
