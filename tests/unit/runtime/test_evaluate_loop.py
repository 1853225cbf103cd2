"""The one evaluation loop (``libai.runtime.evaluate``) in one process, against numbers
written in the test: the mean of losses chosen as exact binary fractions, the batch count,
the metric sums of a step, and cross entropy written out by hand for the predictions path.

The runner is a stand-in exposing exactly what :func:`evaluate` reads of a
:class:`~libai.runtime.parallel.ModelRunner` (``model``, ``util.device`` and ``util.cp_group``, ``pipeline``,
``is_last`` only under pipeline parallel, ``eval_loss``, ``predict``, ``autocast``), so that
each path, each pipeline stage and each returned value can be chosen. The reduction over
ranks in real layouts is proven by ``tests/doors/fleetx/test_engine_eval_layouts.py``."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from libai.runtime import evaluate as evaluate_module
from libai.runtime.evaluate import (
    EvalResult,
    eval_mode,
    evaluate,
    step_loss_and_sums,
    sum_over_ranks,
)

CPU = torch.device("cpu")
#: exact in binary, so every mean below is exact
LOSSES = [0.5, 1.25, 3.0, 0.25]


class Scorer(nn.Module):
    """A real model: dropout (so eval mode changes its logits) and a linear layer, with the
    pipeline contract's loss and target key."""

    pipeline_target_key = "labels"

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.drop = nn.Dropout(0.5)
        self.proj = nn.Linear(3, 4)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(4, 3, generator=generator))
            self.proj.bias.copy_(torch.randn(4, generator=generator))

    def forward(self, x):
        return self.proj(self.drop(x))

    def pipeline_loss(self, logits, target):
        return nn.functional.cross_entropy(logits, target)


class Runner:
    """What :func:`evaluate` reads of a ModelRunner; records how it was called."""

    def __init__(self, model, *, pipeline=False, is_last=True, device=CPU):
        self.model = model
        self.util = SimpleNamespace(device=device, cp_group=None)
        self.pipeline = pipeline
        if pipeline:  # a ModelRunner has stage flags only under pipeline parallel
            self.is_last = is_last
        self.in_autocast = False
        self.calls = []

    @contextlib.contextmanager
    def autocast(self):
        self.in_autocast = True
        try:
            yield
        finally:
            self.in_autocast = False

    def _record(self, name, batch):
        self.calls.append((name, self.model.training, torch.is_grad_enabled(), batch))

    def eval_loss(self, batch):
        self._record("eval_loss", batch)
        return batch["loss"]

    def predict(self, batch):
        self._record("predict", batch)
        if self.pipeline and not self.is_last:
            return None
        return self.model(batch["x"])


def make_batches(losses=LOSSES, rows=2):
    generator = torch.Generator().manual_seed(1)
    return [
        {
            "x": torch.randn(rows, 3, generator=generator),
            "labels": torch.randint(0, 4, (rows,), generator=generator),
            "loss": None if loss is None else torch.tensor(loss),
        }
        for loss in losses
    ]


def hand_cross_entropy(logits, labels):
    """Mean negative log-likelihood, written out (not nn.functional.cross_entropy)."""
    log_z = logits.exp().sum(-1).log()
    picked = logits[torch.arange(len(labels)), labels]
    return float((log_z - picked).mean())


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, index, batch, loss, logits):
        self.calls.append((index, batch, loss, logits))


def test_eval_loss_path_mean_count_and_callbacks():
    model = Scorer().train()
    runner = Runner(model)
    batches = make_batches()
    on_batch = Recorder()
    before = time.perf_counter()
    result = evaluate(runner, batches, on_batch=on_batch)
    wall = time.perf_counter() - before

    assert isinstance(result, EvalResult)
    assert result.loss == sum(LOSSES) / len(LOSSES)
    assert result.batches == len(LOSSES) and type(result.batches) is int
    assert result.sums == {}
    assert 0 < result.seconds <= wall
    # every batch scored by eval_loss, in eval mode without gradients
    assert [c[:3] for c in runner.calls] == [("eval_loss", False, False)] * len(LOSSES)
    assert [c[0] for c in on_batch.calls] == list(range(len(LOSSES)))
    for (_, batch, loss, logits), given in zip(on_batch.calls, batches):
        assert batch["loss"] is given["loss"] and torch.equal(batch["x"], given["x"])
        assert loss is given["loss"] and logits is None
    assert model.training and all(m.training for m in model.modules())


def test_a_single_batch_and_an_empty_loader():
    result = evaluate(Runner(Scorer()), make_batches([1.5]))
    assert (result.loss, result.batches) == (1.5, 1)
    result = evaluate(Runner(Scorer()), [])
    assert (result.loss, result.batches, result.sums) == (0.0, 0, {})
    assert type(result.batches) is int


@pytest.mark.parametrize("max_batches", [0, 1, 3, 4, 9])
def test_max_batches_stops_after_k(max_batches):
    pulled = []

    def loader():
        for batch in make_batches():
            pulled.append(batch)
            yield batch

    on_batch = Recorder()
    result = evaluate(Runner(Scorer()), loader(), max_batches=max_batches, on_batch=on_batch)
    scored = LOSSES[:max_batches] if max_batches else LOSSES
    assert result.loss == sum(scored) / len(scored)
    assert result.batches == len(scored)
    assert [c[0] for c in on_batch.calls] == list(range(len(scored)))
    # the loader is not read past the batch after the last one scored
    assert len(pulled) <= len(scored) + 1


def test_prepare_is_applied_before_scoring():
    runner = Runner(Scorer())
    on_batch = Recorder()

    def prepare(batch):
        return {**batch, "loss": batch["loss"] * 2, "prepared": True}

    result = evaluate(runner, make_batches(), prepare=prepare, on_batch=on_batch)
    assert result.loss == 2 * sum(LOSSES) / len(LOSSES)
    assert all(call[3]["prepared"] for call in runner.calls)
    assert all(call[1]["prepared"] for call in on_batch.calls)


class MovedTensor(torch.Tensor):
    """A tensor that records where ``.to`` sends it."""

    targets: list = []

    def to(self, *args, **kwargs):
        MovedTensor.targets.append(args[0] if args else kwargs.get("device"))
        return super().to(*args, **kwargs)


def test_the_batch_is_moved_to_the_runner_device():
    MovedTensor.targets = []
    batch = make_batches([0.5])[0]
    batch["x"] = batch["x"].as_subclass(MovedTensor)
    device = torch.device("cpu")
    evaluate(Runner(Scorer(), device=device), [batch])
    assert MovedTensor.targets == [device]


@pytest.mark.parametrize("pipeline", [False, True])
def test_predictions_score_the_logits_with_pipeline_loss(pipeline):
    model = Scorer().train()
    runner = Runner(model, pipeline=pipeline, is_last=True)
    batches = make_batches()
    on_batch = Recorder()
    step_calls = []
    result = evaluate(
        runner,
        batches,
        predictions=True,
        on_batch=on_batch,
        step=lambda batch: step_calls.append(batch),
    )
    model.eval()
    with torch.no_grad():
        expected_logits = [model(b["x"]) for b in batches]
    expected = [hand_cross_entropy(lg, b["labels"]) for lg, b in zip(expected_logits, batches)]
    assert result.loss == pytest.approx(sum(expected) / len(expected), rel=1e-6)
    assert result.batches == len(batches)
    assert step_calls == []
    assert [c[:3] for c in runner.calls] == [("predict", False, False)] * len(batches)
    for (index, batch, loss, logits), want, want_logits in zip(
        on_batch.calls, expected, expected_logits
    ):
        assert torch.equal(logits, want_logits)
        assert loss.dtype == torch.float32 and float(loss) == pytest.approx(want, rel=1e-6)
        assert torch.equal(batch["labels"], batches[index]["labels"])


def test_predictions_on_a_stage_without_outputs_count_nothing():
    runner = Runner(Scorer(), pipeline=True, is_last=False)
    on_batch = Recorder()
    result = evaluate(runner, make_batches(), predictions=True, on_batch=on_batch)
    assert (result.loss, result.batches) == (0.0, 0)
    assert len(on_batch.calls) == len(LOSSES)
    assert all(loss is None and logits is None for _, _, loss, logits in on_batch.calls)


def test_step_runs_under_autocast_and_returns_a_tensor():
    model = Scorer().train()
    runner = Runner(model)
    seen = []

    def step(batch):
        seen.append((runner.in_autocast, model.training, torch.is_grad_enabled()))
        return batch["loss"].double().requires_grad_()

    on_batch = Recorder()
    result = evaluate(runner, make_batches(), step=step, on_batch=on_batch)
    assert result.loss == sum(LOSSES) / len(LOSSES)
    assert result.batches == len(LOSSES)
    assert seen == [(True, False, False)] * len(LOSSES)
    assert runner.calls == []  # eval_loss not used
    for (_, _, loss, logits), want in zip(on_batch.calls, LOSSES):
        assert loss.dtype == torch.float32 and not loss.requires_grad and float(loss) == want
        assert logits is None


def test_step_mappings_loss_entry_and_sums():
    outputs = [
        # "loss" wins over the other *loss* keys; numbers besides losses are summed
        {
            "loss": torch.tensor(2.0),
            "aux_loss": torch.tensor(5.0),
            "total": 4,
            "correct": torch.tensor([1.0, 2.0]),
            "skipped": None,
        },
        # without "loss": the sum of the *loss* keys, as the model contract sums them
        {
            "lm_loss": torch.tensor(1.5),
            "aux_loss": torch.tensor(0.25),
            "none_loss": None,
            "total": 2.5,
            "correct": torch.tensor([[3.0], [0.5]]),
            "skipped": None,
        },
    ]
    batches = iter(outputs)
    on_batch = Recorder()
    result = evaluate(
        Runner(Scorer()), make_batches([1.0, 1.0]), step=lambda b: next(batches), on_batch=on_batch
    )
    assert result.loss == (2.0 + 1.75) / 2
    assert result.batches == 2
    assert result.sums == {"correct": 6.5, "total": 6.5}
    assert list(result.sums) == ["correct", "total"]
    assert all(type(v) is float for v in result.sums.values())
    assert [float(c[2]) for c in on_batch.calls] == [2.0, 1.75]


def test_step_is_not_used_under_pipeline_parallel():
    step_calls = []
    runner = Runner(Scorer(), pipeline=True, is_last=True)
    result = evaluate(runner, make_batches(), step=lambda b: step_calls.append(b))
    assert step_calls == []
    assert [c[0] for c in runner.calls] == ["eval_loss"] * len(LOSSES)
    assert (result.loss, result.batches) == (sum(LOSSES) / len(LOSSES), len(LOSSES))


def test_only_the_last_pipeline_stage_counts():
    # eval_loss copies the loss to every stage; only the last one counts it
    on_batch = Recorder()
    runner = Runner(Scorer(), pipeline=True, is_last=False)
    result = evaluate(runner, make_batches(), on_batch=on_batch)
    assert (result.loss, result.batches) == (0.0, 0)
    assert [float(c[2]) for c in on_batch.calls] == LOSSES
    last = evaluate(Runner(Scorer(), pipeline=True, is_last=True), make_batches())
    assert (last.loss, last.batches) == (sum(LOSSES) / len(LOSSES), len(LOSSES))


def test_batches_without_a_loss_are_not_counted():
    on_batch = Recorder()
    result = evaluate(Runner(Scorer()), make_batches([0.5, None, 1.5, None]), on_batch=on_batch)
    assert (result.loss, result.batches) == (1.0, 2)
    assert [c[2] is None for c in on_batch.calls] == [False, True, False, True]


@pytest.mark.parametrize("training", [True, False])
def test_the_model_mode_is_restored(training):
    model = Scorer().train(training)
    evaluate(Runner(model), make_batches())
    assert [m.training for m in model.modules()] == [training] * len(list(model.modules()))

    def failing_step(batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        evaluate(Runner(model), make_batches(), step=failing_step)
    assert [m.training for m in model.modules()] == [training] * len(list(model.modules()))


def test_eval_mode_context():
    model = Scorer().train()
    with eval_mode(model):
        assert not model.training and not model.drop.training
        assert not torch.is_grad_enabled()
    assert model.training and model.drop.training and torch.is_grad_enabled()


def test_a_step_returning_something_else_is_refused():
    with pytest.raises(TypeError) as error:
        evaluate(Runner(Scorer()), make_batches(), step=lambda b: [b["loss"]])
    assert str(error.value) == (
        "an evaluation step must return a loss tensor or a mapping with a loss entry, got list"
    )


def test_step_loss_and_sums_adds_into_existing_sums():
    sums = {"correct": 1.0}
    loss = step_loss_and_sums(
        {"correct": torch.tensor([2.0, 0.5]), "loss": torch.tensor(0.75, requires_grad=True)},
        sums,
    )
    assert loss.dtype == torch.float32 and not loss.requires_grad and float(loss) == 0.75
    assert sums == {"correct": 3.5}
    tensor_loss = step_loss_and_sums(torch.tensor(1.5, dtype=torch.float64), sums)
    assert tensor_loss.dtype == torch.float32 and float(tensor_loss) == 1.5
    assert sums == {"correct": 3.5}


def test_sum_over_ranks_in_one_process_keeps_float64_values():
    values = [1 / 3, 7, 0.1, 2.0**40 + 0.5]
    totals = sum_over_ranks(iter(values), CPU)
    assert totals == [1 / 3, 7.0, 0.1, 2.0**40 + 0.5]
    assert all(type(v) is float for v in totals)


def test_sum_over_ranks_reduces_one_float64_tensor(monkeypatch):
    reduced = []

    def spy(values):
        reduced.append((values.dtype, values.tolist()))
        return values

    monkeypatch.setattr(evaluate_module, "all_reduce_over_data_parallel", spy)
    assert sum_over_ranks([1.0, 2.0], CPU) == [1.0, 2.0]
    assert reduced == [(torch.float64, [1.0, 2.0])]


def test_eval_result_defaults():
    result = EvalResult(loss=1.0, batches=2)
    assert result.sums == {} and result.seconds == 0.0
    assert EvalResult(loss=1.0, batches=2).sums is not result.sums
