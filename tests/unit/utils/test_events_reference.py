"""libai.utils.events against hand-computed numbers: the printer's whole line (ETA from the
step times or the wall clock, the smoothing windows, lr, tokens/s, memory), the default
windows of every reader and writer, the JSON / TensorBoard lines of each iteration written
once, the history buffer's global average of device values, and the rank policy on a fake
process group."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import os
import statistics
import types

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor, Partial, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from libai import dist
from libai.utils import events
from libai.utils.events import (
    CommonMetricPrinter,
    EventStorage,
    HistoryBuffer,
    JSONWriter,
    TensorboardXWriter,
    iter_metrics,
)


@pytest.fixture
def printed():
    """The messages of the printer's logger (``libai.utils.events``)."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("libai.utils.events")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def messages(records) -> list[str]:
    return [r.getMessage() for r in records]


def eta_text(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def mean(values) -> float:
    return sum(values) / len(values)


@contextlib.contextmanager
def fake_world(rank: int, world_size: int):
    """This process plays ``rank`` of a ``world_size`` world (PyTorch's fake collectives)."""
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    dist.reset_dist_util()
    torch_dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        torch_dist.destroy_process_group()
        dist.reset_dist_util()


def read_tensorboard(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# ---- CommonMetricPrinter ------------------------------------------------------------------------
def test_printer_line_equals_the_hand_computed_one(printed, monkeypatch):
    times = [0.2, 0.4, 0.1, 0.3, 0.6]
    data_times = [0.01, 0.02, 0.03, 0.05, 0.07]
    total = [9.0, 7.0, 8.0, 3.0, 5.0]
    lm = [4.5, 4.25, 4.125, 2.5, 2.75]
    window, max_iter, tokens = 3, 50, 640
    printer = CommonMetricPrinter(max_iter=max_iter, window_size=window, tokens_per_iter=tokens)
    with EventStorage() as storage:
        for storage.iter in range(5):
            i = storage.iter
            storage.put_scalars(total_loss=total[i], lm_loss=lm[i])
            storage.put_scalars(time=times[i], data_time=data_times[i])
            storage.put_scalar("lr", 1e-4 * (i + 1), smoothing_hint=False)
        storage.put_scalar("val_loss", 3.5, smoothing_hint=False)  # an evaluation result
        # a CUDA machine: the peak memory in MiB (2**20 bytes)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 300 * 2**20)
        printer.write()
        monkeypatch.undo()
    iter_time = mean(times[-window:])
    expected = "  ".join(
        [
            f"eta: {eta_text(statistics.median(times) * (max_iter - 4 - 1))}",
            f"iteration: 4/{max_iter}",
            f"total_loss: {statistics.median(total[-window:]):.4g}",
            f"lm_loss: {statistics.median(lm[-window:]):.4g}",
            f"time: {iter_time:.4f} s/iter",
            f"data_time: {mean(data_times[-window:]):.4f} s/iter",
            f"tokens/s: {tokens / iter_time:.1f}",
            "lr: 5.000e-04",
            "max_mem: 300M",
        ]
    )
    assert messages(printed) == [expected]
    assert expected.startswith("eta: 0:00:13  iteration: 4/50  total_loss: 5  lm_loss: 2.75  ")
    assert "tokens/s: 1920.0" in expected


def test_printer_default_window_is_twenty(printed):
    printer = CommonMetricPrinter(max_iter=100)
    with EventStorage() as storage:
        for storage.iter in range(21):
            storage.put_scalars(total_loss=float(storage.iter**2), time=float(storage.iter))
        printer.write()
    losses = [float(i**2) for i in range(21)]
    times = [float(i) for i in range(21)]
    assert messages(printed) == [
        f"eta: {eta_text(statistics.median(times) * (100 - 20 - 1))}  iteration: 20/100  "
        f"total_loss: {statistics.median(losses[-20:]):.4g}  "
        f"time: {mean(times[-20:]):.4f} s/iter  lr: N/A"
    ]
    assert "total_loss: 110.5  time: 10.5000 s/iter" in messages(printed)[0]


def test_printer_eta_is_the_median_of_the_last_thousand_step_times(printed):
    printer = CommonMetricPrinter(max_iter=1003)
    times = [float(i) for i in range(1001)]
    with EventStorage() as storage:
        for storage.iter, t in enumerate(times):
            storage.put_scalar("time", t)
        printer.write()
        # remaining after iteration 1000: 1003 - 1000 - 1 = 2 steps
        assert statistics.median(times[-1000:]) * 2 == 1001.0
        assert storage.history("eta_seconds").latest() == 1001.0
        assert messages(printed)[0].startswith(f"eta: {eta_text(1001.0)}  iteration: 1000/1003")


def test_printer_eta_at_the_last_iteration_is_zero_and_unsmoothed(printed):
    printer = CommonMetricPrinter(max_iter=4, window_size=2)
    with EventStorage() as storage:
        for storage.iter, t in zip(range(2, 4), [30.0, 50.0]):
            storage.put_scalar("time", t)
            printer.write()
        # eta_seconds: 30 s x (4 - 2 - 1) steps, then 0 at the last iteration
        assert storage.history("eta_seconds").values() == [(30.0, 2), (0.0, 3)]
        assert storage.smoothing_hints()["eta_seconds"] is False
        # unsmoothed: the latest value, not the median of [30, 0]
        assert storage.latest_with_smoothing_hint()["eta_seconds"] == (0.0, 3)
        assert storage.scalars_at(3)["eta_seconds"] == 0.0
    assert [m.split("  ")[0] for m in messages(printed)] == ["eta: 0:00:30", "eta: 0:00:00"]


def test_printer_eta_from_the_wall_clock_between_writes(printed, monkeypatch):
    clock = iter([100.0, 112.5, 113.5])
    monkeypatch.setattr(events, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    printer = CommonMetricPrinter(max_iter=20, tokens_per_iter=640)  # tokens/s needs a timer
    with EventStorage() as storage:
        for storage.iter in (2, 7, 9):
            storage.put_scalar("total_loss", 1.5)
            printer.write()
    # 12.5 s over 5 steps, 12 steps left; then 1 s over 2 steps, 10 steps left
    assert messages(printed) == [
        "iteration: 2/20  total_loss: 1.5  lr: N/A",
        f"eta: {eta_text(12.5 / 5 * 12)}  iteration: 7/20  total_loss: 1.5  lr: N/A",
        f"eta: {eta_text(1.0 / 2 * 10)}  iteration: 9/20  total_loss: 1.5  lr: N/A",
    ]
    assert messages(printed)[1].startswith("eta: 0:00:30  ")


def test_printer_reused_by_a_run_that_redoes_an_iteration(printed, monkeypatch):
    """A second run (fresh storage, no timer) at the iteration of the first run's last
    wall-clock write: no step time to estimate from, so no ETA (and no division by zero)."""
    clock = iter([10.0, 20.0])
    monkeypatch.setattr(events, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    printer = CommonMetricPrinter(max_iter=20)
    with EventStorage(start_iter=5) as first:
        first.put_scalar("total_loss", 2.0)
        printer.write()  # wall clock recorded at iteration 5
        first.iter = 6
        first.put_scalars(total_loss=2.0, time=0.5)
        printer.write()  # from the timer
    with EventStorage(start_iter=5) as second:
        second.put_scalar("total_loss", 2.0)
        printer.write()
    assert messages(printed) == [
        "iteration: 5/20  total_loss: 2  lr: N/A",
        "eta: 0:00:06  iteration: 6/20  total_loss: 2  time: 0.5000 s/iter  lr: N/A",
        "iteration: 5/20  total_loss: 2  lr: N/A",
    ]


def test_a_failed_put_leaves_no_trace(printed):
    printer = CommonMetricPrinter(max_iter=10)
    with EventStorage() as storage:
        storage.put_scalar("total_loss", 1.0)
        with pytest.raises(RuntimeError):
            storage.put_scalar("bad_loss", torch.ones(2))  # not a scalar
        with pytest.raises(KeyError):
            storage.history("bad_loss")
        assert "bad_loss" not in storage.histories()
        assert "bad_loss" not in storage.smoothing_hints()
        with pytest.raises(ValueError, match="smoothing_hint"):
            storage.put_scalar("total_loss", 9.0, smoothing_hint=False)  # another hint
        assert storage.history("total_loss").values() == [(1.0, 0)]
        printer.write()
    assert messages(printed) == ["iteration: 0/10  total_loss: 1  lr: N/A"]


# ---- EventStorage and HistoryBuffer --------------------------------------------------------------
def test_storage_defaults_and_context_order():
    storage = EventStorage()
    assert storage.iter == 0
    outer, inner = EventStorage(), EventStorage()
    with outer:
        inner.__enter__()
        with pytest.raises(RuntimeError, match="reverse order"):
            outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="reverse order"):
        outer.__exit__(None, None, None)


def test_storage_default_windows_are_twenty():
    losses = [float(i**2) for i in range(21)]
    with EventStorage() as storage:
        for storage.iter, v in enumerate(losses):
            storage.put_scalar("total_loss", v)
            storage.put_scalar("ppl", v + 1.0, smoothing_hint=False)
        expected = statistics.median(losses[-20:])
        assert expected == 110.5
        assert storage.latest_with_smoothing_hint() == {
            "total_loss": (expected, 20),
            "ppl": (401.0, 20),  # unsmoothed: the latest value, not a median
        }
        assert storage.scalars_at(20) == {"total_loss": expected, "ppl": 401.0}


def test_history_buffer_global_average_of_tensors():
    buf = HistoryBuffer()
    assert buf.global_avg() == 0.0
    buf.update(5.0)
    assert buf.global_avg() == 5.0  # one value: itself
    buf.update(torch.tensor(1.0))
    buf.update(torch.tensor(3.0))
    assert buf.global_avg() == 3.0  # (5 + 1 + 3) / 3
    buf.update(torch.tensor(7.0))  # after a read, values are pending again
    buf.update(4.0)
    assert buf.global_avg() == 4.0  # 20 / 5
    assert buf.values() == [(5.0, 0), (1.0, 1), (3.0, 2), (7.0, 3), (4.0, 4)]


def test_history_buffer_keeps_a_million_values_by_default():
    buf = HistoryBuffer()
    n = 1_000_000
    # consume the updates without a Python-level loop body (the test runs ~0.5 s)
    for _ in itertools.starmap(buf.update, itertools.repeat((1.0,), n + 1)):
        pass
    assert len(buf) == n
    assert buf.values()[0] == (1.0, 1)  # the first one was dropped
    assert buf.global_avg() == 1.0


# ---- JSONWriter and iter_metrics -----------------------------------------------------------------
def test_json_writer_default_window_sorted_keys_and_first_iterations(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage() as storage:
        for storage.iter in range(21):
            # put in reverse alphabetical order: the line is sorted anyway
            storage.put_scalar("zeta_loss", float(storage.iter**2))
            storage.put_scalar("alpha", float(storage.iter), smoothing_hint=False)
            writer.write()  # every iteration, from iteration 0
        writer.write()  # nothing new
    writer.close()
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == list(range(21))
    assert records[0] == {"iteration": 0, "alpha": 0.0, "zeta_loss": 0.0}
    assert records[1] == {"iteration": 1, "alpha": 1.0, "zeta_loss": 0.5}  # median of [0, 1]
    assert records[20]["zeta_loss"] == statistics.median([float(i**2) for i in range(1, 21)])
    for line, record in zip(lines, records):
        assert line == json.dumps(record, sort_keys=True)
        assert list(record) == sorted(record)


def test_json_writer_backdated_evaluation_does_not_repeat_lines(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=1)
    with EventStorage() as storage:
        for storage.iter in range(20):
            storage.put_scalar("total_loss", float(storage.iter))
            if storage.iter in (9, 19):
                writer.write()
        storage.iter = 14  # an evaluation recorded at an earlier iteration
        storage.put_scalar("ppl", 3.0, smoothing_hint=False)
        writer.write()
        writer.write()  # nothing new since
        writer.close()
        writer.write()  # after close: nothing, no error
        writer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [
        {"iteration": 9, "total_loss": 9.0},
        {"iteration": 19, "total_loss": 19.0},
        {"iteration": 14, "ppl": 3.0, "total_loss": 14.0},
    ]


def test_iter_metrics_skips_blank_and_torn_lines_anywhere(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(
        '{"iteration": 0, "total_loss": 3.0}\n'
        "\n"
        '{"iteration": 1, "total_loss": 2.0}\n'
        '{"iteration": 2, "total_lo\n'  # torn by a killed run, then the resumed run appends
        '{"iteration": 2, "total_loss": 1.0}\n'
        '{"note": "no iteration"}\n'
        '{"iteration": 3, "total_loss": 0.5}\n'
    )
    assert [r["total_loss"] for r in iter_metrics(str(path))] == [3.0, 2.0, 1.0, 0.5]


# ---- TensorboardXWriter ----------------------------------------------------------------------------
def test_tensorboard_default_window_kwargs_and_each_step_once(tmp_path):
    log_dir = tmp_path / "tb"
    writer = TensorboardXWriter(str(log_dir), filename_suffix=".libai")
    with EventStorage() as storage:
        for storage.iter in range(21):
            storage.put_scalar("total_loss", float(storage.iter**2))
            if storage.iter < 3 or storage.iter == 20:
                writer.write()  # iterations 0, 1, 2 and 20
                writer.write()  # twice: nothing new the second time
    writer.close()
    writer.write()  # after close: nothing, no error
    writer.close()
    files = os.listdir(log_dir)
    assert len(files) == 1 and files[0].startswith("events.out.tfevents")
    assert files[0].endswith(".libai")  # the SummaryWriter keyword reached it
    expected = statistics.median([float(i**2) for i in range(1, 21)])
    assert read_tensorboard(log_dir) == {
        "total_loss": [(0, 0.0), (1, 0.5), (2, 1.0), (20, expected)]
    }


# ---- the rank policy and global values -------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_zero_writes(tmp_path, rank):
    with fake_world(rank, 2):
        assert events._is_main_process() is (rank == 0)
        writer = JSONWriter(str(tmp_path / "metrics.json"))
        with EventStorage() as storage:
            storage.put_scalar("total_loss", 2.0)
            writer.write()
        writer.close()
    assert (tmp_path / "metrics.json").exists() is (rank == 0)


def test_a_global_tensor_is_recorded_as_its_full_value():
    with fake_world(0, 1):
        mesh = init_device_mesh("cpu", (1,))
        # a pending sum over a world of one: its full value is the local one
        loss = DTensor.from_local(torch.tensor(2.5), mesh, [Partial()])
        with EventStorage() as storage:
            storage.put_scalar("total_loss", loss)
            storage.put_scalar("total_loss", 4.5)
            assert storage.history("total_loss").values() == [(2.5, 0), (4.5, 0)]
            assert storage.history("total_loss").global_avg() == 3.5
