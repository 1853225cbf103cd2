"""EventStorage, the three writers, setup_logger and the loss-curve plot (single process)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from libai.utils import events
from libai.utils.events import (
    CommonMetricPrinter,
    EventStorage,
    HistoryBuffer,
    JSONWriter,
    TensorboardXWriter,
    get_event_storage,
    iter_metrics,
)
from libai.utils.logger import log_every_n, log_first_n, setup_logger
from libai.utils.plot import plot_loss_curve


@pytest.fixture
def capture():
    """Records of the ``libai`` logger tree, even when setup_logger stopped propagation."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    root = logging.getLogger("libai")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield records
    root.removeHandler(handler)
    root.setLevel(old_level)


def fake_training(storage, writers, iters: int, period: int, eval_at=(), close=True):
    """A detectron2-style loop: scalars every step, eval results, writers every period."""
    for storage.iter in range(iters):
        it = storage.iter
        storage.put_scalars(total_loss=10.0 / (it + 1), lm_loss=10.0 / (it + 1))
        storage.put_scalar("lr", 1e-3 * (it + 1) / iters, smoothing_hint=False)
        storage.put_scalars(time=0.5, data_time=0.01)
        if it in eval_at:
            storage.put_scalars(ppl=100.0 / (it + 1), loss=4.0 - it / 100, smoothing_hint=False)
        if (it + 1) % period == 0 or it == iters - 1:
            for writer in writers:
                writer.write()
    if close:
        for writer in writers:
            writer.close()


# ---- storage ------------------------------------------------------------------------------------
def test_history_buffer_stats():
    buf = HistoryBuffer()
    for i, v in enumerate([5.0, 1.0, 3.0, 2.0, 10.0]):
        buf.update(v, i)
    assert buf.latest() == 10.0
    assert buf.median(3) == 3.0  # of [3, 2, 10]
    assert buf.avg(2) == 6.0  # of [2, 10]
    assert buf.global_avg() == pytest.approx(21.0 / 5)
    assert buf.values()[0] == (5.0, 0)
    # the global average survives the bounded window
    small = HistoryBuffer(max_length=2)
    for v in [1.0, 2.0, 3.0, 6.0]:
        small.update(v)
    assert len(small) == 2 and small.avg(10) == 4.5
    assert small.global_avg() == 3.0
    assert [it for _, it in small.values()] == [2, 3]


def test_event_storage_context_and_scalars():
    with pytest.raises(RuntimeError, match="EventStorage"):
        get_event_storage()
    with EventStorage(start_iter=7) as storage:
        assert get_event_storage() is storage
        assert storage.iter == storage.iteration == 7
        storage.put_scalar("total_loss", torch.tensor(2.0))
        storage.step()
        storage.put_scalar("total_loss", 4.0)
        storage.put_scalars(ppl=3.0, smoothing_hint=False)
        assert storage.iter == 8
        assert storage.history("total_loss").values() == [(2.0, 7), (4.0, 8)]
        assert storage.latest() == {"total_loss": (4.0, 8), "ppl": (3.0, 8)}
        smoothed = storage.latest_with_smoothing_hint(window_size=2)
        assert smoothed["total_loss"] == (3.0, 8)  # median of [2, 4]
        assert smoothed["ppl"] == (3.0, 8)
        assert storage.smoothing_hints() == {"total_loss": True, "ppl": False}
        with pytest.raises(KeyError):
            storage.history("missing")
        with pytest.raises(ValueError, match="smoothing_hint"):
            storage.put_scalar("ppl", 1.0, smoothing_hint=True)
        storage.iter = 20
        assert storage.iter == 20
    with pytest.raises(RuntimeError):
        get_event_storage()


# ---- writers --------------------------------------------------------------------------------------
def test_json_writer_lines(tmp_path):
    path = tmp_path / "out" / "metrics.json"
    with EventStorage() as storage:
        fake_training(storage, [JSONWriter(str(path), window_size=5)], 30, 10, eval_at=(19,))
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == [9, 19, 29]
    for record in records:
        assert {"iteration", "total_loss", "lr", "time", "data_time", "lm_loss"} <= set(record)
    assert records[0]["total_loss"] == pytest.approx(10.0 / 8)  # median of iters 5..9
    assert records[0]["lr"] == pytest.approx(1e-3 * 10 / 30)  # unsmoothed: the latest value
    assert records[1]["ppl"] == pytest.approx(5.0) and records[1]["loss"] == pytest.approx(3.81)
    assert "ppl" not in records[2]  # written once, at the iteration it was put


def test_json_writer_off_period_and_late_scalars(tmp_path):
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(path), window_size=1)
        # evaluation at 14 lands between writes at 9 and 19: its line is complete
        fake_training(storage, [writer], 20, 10, eval_at=(14,), close=False)
        # a hook that runs after the writer at the last step: a second, complete line
        storage.put_scalar("ppl", 2.0, smoothing_hint=False)
        writer.write()
        # detectron2's after_train convention (iter = max_iter): an evaluation-only line
        storage.iter = 20
        storage.put_scalar("ppl", 1.5, smoothing_hint=False)
        writer.write()
        writer.write()  # nothing new: no line
        writer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["iteration"] for r in records] == [9, 14, 19, 19, 20]
    assert records[1]["total_loss"] == pytest.approx(10.0 / 15)  # iteration 14's own value
    assert records[1]["lr"] == pytest.approx(1e-3 * 15 / 20) and records[1]["ppl"] == 100 / 15
    assert "ppl" not in records[2] and records[3]["ppl"] == 2.0
    assert records[3]["total_loss"] == records[2]["total_loss"]
    assert records[4] == {"iteration": 20, "ppl": 1.5}
    assert [r["iteration"] for r in iter_metrics(str(path))] == [9, 14, 19, 20]


def test_json_writer_appends_and_reader_keeps_last(tmp_path):
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        fake_training(storage, [JSONWriter(str(path))], 20, 10)
    with EventStorage(start_iter=10) as storage:  # a resumed run re-does 10..19
        writer = JSONWriter(str(path))
        for storage.iter in range(10, 20):
            storage.put_scalars(total_loss=1.0, time=0.1)
        writer.write()
        writer.close()
    with open(path, "a") as f:
        f.write('{"iteration": 25, "total_lo')  # torn line of a killed process
    records = list(iter_metrics(str(path)))
    assert [r["iteration"] for r in records] == [9, 19]
    assert records[-1]["total_loss"] == 1.0


def test_writers_are_noops_off_the_main_process(tmp_path, monkeypatch, capture):
    monkeypatch.setattr(events, "_is_main_process", lambda: False)
    json_path = tmp_path / "metrics.json"
    writers = [
        JSONWriter(str(json_path)),
        TensorboardXWriter(str(tmp_path / "tb")),
        CommonMetricPrinter(max_iter=10),
    ]
    with EventStorage() as storage:
        fake_training(storage, writers, 10, 5)
    assert not json_path.exists()
    assert not (tmp_path / "tb").exists()
    assert not [r for r in capture if r.name == "libai.utils.events"]


def test_tensorboard_writer_event_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = tmp_path / "tb"
    with EventStorage() as storage:
        fake_training(
            storage, [TensorboardXWriter(str(log_dir), window_size=1)], 20, 10, eval_at=(19,)
        )
    files = [f for f in os.listdir(log_dir) if f.startswith("events.out.tfevents")]
    assert files
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    assert {"total_loss", "lr", "time", "ppl"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("total_loss")
    assert [e.step for e in loss] == [9, 19]
    assert loss[0].value == pytest.approx(1.0)  # window 1: iteration 9's raw value
    assert acc.Scalars("ppl")[0].value == pytest.approx(5.0)


def test_printer_eta_losses_tokens_per_second(capture):
    printer = CommonMetricPrinter(max_iter=100, window_size=20, tokens_per_iter=1000)
    with EventStorage() as storage:
        fake_training(storage, [printer], 10, 10, eval_at=(9,))
    lines = [r.getMessage() for r in capture if r.name == "libai.utils.events"]
    assert len(lines) == 1
    line = lines[0]
    # step time 0.5 s, 90 steps left after iteration 9
    assert "eta: 0:00:45" in line
    assert "iteration: 9/100" in line
    assert "tokens/s: 2000.0" in line  # 1000 tokens / 0.5 s
    assert "time: 0.5000 s/iter" in line and "data_time: 0.0100 s/iter" in line
    assert "total_loss: " in line and "lm_loss: " in line
    assert "lr: 1.000e-03" in line
    assert " loss: " not in line  # evaluation results (unsmoothed) are not training losses
    assert storage.history("eta_seconds").latest() == pytest.approx(45.0)
    with storage:
        printer.write()  # same iteration again
        storage.iter = 100
        printer.write()  # after training
    assert len([r for r in capture if r.name == "libai.utils.events"]) == 1


def test_printer_eta_without_timer(capture):
    printer = CommonMetricPrinter(max_iter=50)
    with EventStorage() as storage:
        for storage.iter in range(3):
            storage.put_scalar("total_loss", 1.0)
            printer.write()
    lines = [r.getMessage() for r in capture if r.name == "libai.utils.events"]
    assert len(lines) == 3
    assert "eta:" not in lines[0] and "eta: " in lines[1]  # estimated from the wall clock
    assert "tokens/s" not in lines[1] and "lr: N/A" in lines[1]


# ---- logger ---------------------------------------------------------------------------------------
@pytest.fixture
def clean_logger():
    name = "libai_test_logger"
    yield name
    logger = logging.getLogger(name)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def test_setup_logger_files_levels_idempotent(tmp_path, clean_logger, capsys):
    logger = setup_logger(str(tmp_path), distributed_rank=0, name=clean_logger)
    setup_logger(str(tmp_path), distributed_rank=0, name=clean_logger)
    assert len(logger.handlers) == 2  # console + file, not duplicated
    logger.info("hello from rank 0")
    logger.debug("debug detail")
    out = capsys.readouterr().out
    assert out.count("hello from rank 0") == 1 and "debug detail" not in out
    assert "INFO" in out and "[" in out  # formatted with time and level
    text = (tmp_path / "log.txt").read_text()
    assert "hello from rank 0" in text and "debug detail" in text

    setup_logger(str(tmp_path), distributed_rank=1, name=clean_logger)
    logger.info("info on rank 1")
    logger.warning("warning on rank 1")
    out = capsys.readouterr().out
    assert "info on rank 1" not in out and "warning on rank 1" in out
    rank_file = (tmp_path / "log.txt.rank1").read_text()
    assert "info on rank 1" in rank_file and "warning on rank 1" in rank_file
    assert "rank 1" not in (tmp_path / "log.txt").read_text()


def test_rate_limited_logging(capture):
    for _ in range(5):
        log_first_n(logging.INFO, "first", n=2, name="libai.test")
        log_every_n(logging.INFO, "every", n=2, name="libai.test")
    messages = [r.getMessage() for r in capture if r.name == "libai.test"]
    assert messages.count("first") == 2
    assert messages.count("every") == 3


# ---- plot -------------------------------------------------------------------------------------------
def test_loss_curve_png(tmp_path):
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        fake_training(storage, [JSONWriter(str(path), window_size=1)], 60, 5, eval_at=(19, 39, 59))
    out = plot_loss_curve(str(path), str(tmp_path / "plots" / "loss_curve.png"))
    data = open(out, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    if os.environ.get("LIBAI_KEEP_PLOT"):
        open(os.environ["LIBAI_KEEP_PLOT"], "wb").write(data)


def test_loss_curve_without_metrics_raises(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"iteration": 0, "lr": 0.1}\n')
    with pytest.raises(ValueError, match="total_loss"):
        plot_loss_curve(str(path), str(tmp_path / "x.png"))
