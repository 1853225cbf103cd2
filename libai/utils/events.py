"""Training metrics: an :class:`EventStorage` the trainer fills, and writers that report it.

The shape is detectron2's (and LiBai's): the trainer opens ``with EventStorage(start_iter)``,
sets ``storage.iter`` before every step, and hooks put scalars into it (``total_loss``,
``lr``, ``time``, ``data_time``, evaluation results, ...). Every ``period`` iterations a
``PeriodicWriter`` hook calls :meth:`EventWriter.write` on each writer:

* :class:`CommonMetricPrinter` -- one human-readable line on the console (ETA, losses, lr,
  time, tokens/s, memory);
* :class:`JSONWriter` -- one JSON object per line in ``output_dir/metrics.json``;
* :class:`TensorboardXWriter` -- TensorBoard event files.

**Rank policy.** Writers may be constructed on every rank: they only open files and write
on the main process (global rank 0) and are silent no-ops elsewhere, so the trainer does not
need rank checks. Consequently the values rank 0 puts into its storage are the ones reported:
under pipeline parallelism the loss lives on the last stage, so the trainer must reduce or
broadcast it (e.g. sum over the pipeline group, as ``ModelRunner`` does) before
``put_scalar``.

**Iteration convention.** ``storage.iter`` is the 0-based index of the step being run (or
just finished, when writers run in ``after_step``); ``ETA = median step time x (max_iter -
iter - 1)``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor


def _full(value: torch.Tensor) -> torch.Tensor:
    """A global (DTensor) value as the full plain tensor; a plain tensor as it is."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def _is_main_process() -> bool:
    """Rank 0 of the job (or no process group)."""
    return not torch_dist.is_initialized() or torch_dist.get_rank() == 0


__all__ = [
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "HistoryBuffer",
    "JSONWriter",
    "TensorboardXWriter",
    "get_event_storage",
    "iter_metrics",
]

_CURRENT_STORAGE_STACK: list[EventStorage] = []


def get_event_storage() -> EventStorage:
    """The innermost :class:`EventStorage` that is currently open (``with EventStorage()``)."""
    if not _CURRENT_STORAGE_STACK:
        raise RuntimeError(
            "get_event_storage() has to be called inside a 'with EventStorage(...)' context."
        )
    return _CURRENT_STORAGE_STACK[-1]


class HistoryBuffer:
    """The values of one scalar over iterations, with windowed statistics.

    Keeps at most ``max_length`` recent ``(value, iteration)`` pairs; :meth:`global_avg` is
    over every value ever added. A value may be a one-element tensor (a loss still on the
    GPU): it is read back to the host only when the buffer is read, all pending values in
    one transfer, so a training step that records its loss does not wait for the device.
    """

    def __init__(self, max_length: int = 1_000_000):
        self._max_length = max_length
        self._data: list[tuple[float, float]] = []
        self._count = 0
        self._global_sum = 0.0
        self._pending: list[int] = []  # positions in _data still holding tensors

    def update(self, value, iteration: float | None = None) -> None:
        """Append ``value`` (a number or a one-element tensor) at ``iteration`` (default:
        one past the last recorded iteration)."""
        if len(self._data) == self._max_length:
            self._materialize()
            self._data.pop(0)
        if iteration is None:
            iteration = self._count
        if isinstance(value, torch.Tensor):
            self._pending.append(len(self._data))
            value = value.detach().reshape(())
        else:
            self._global_sum += value
        self._data.append((value, iteration))
        self._count += 1

    def _materialize(self) -> None:
        """Read every pending tensor back as a float (one device-to-host transfer)."""
        if not self._pending:
            return
        tensors = [self._data[i][0] for i in self._pending]
        values = torch.stack([t.float() for t in tensors]).tolist()
        for i, value in zip(self._pending, values):
            self._data[i] = (value, self._data[i][1])
            self._global_sum += value
        self._pending = []

    def latest(self) -> float:
        """The most recent value."""
        self._materialize()
        return self._data[-1][0]

    def median(self, window_size: int) -> float:
        """Median of the last ``window_size`` values."""
        self._materialize()
        return float(np.median([x[0] for x in self._data[-window_size:]]))

    def avg(self, window_size: int) -> float:
        """Mean of the last ``window_size`` values."""
        self._materialize()
        return float(np.mean([x[0] for x in self._data[-window_size:]]))

    def global_avg(self) -> float:
        """Mean of every value ever added (not limited to ``max_length``)."""
        self._materialize()
        return self._global_sum / max(self._count, 1)

    def values(self) -> list[tuple[float, float]]:
        """The stored ``(value, iteration)`` pairs, oldest first."""
        self._materialize()
        return list(self._data)

    def window_at(self, iteration: float, window_size: int) -> list[float] | None:
        """The last ``window_size`` values up to and including the one put at ``iteration``.

        ``None`` when no value was put at exactly ``iteration``. Scans from the newest value,
        so looking up a recent iteration is cheap.
        """
        self._materialize()
        j = len(self._data) - 1
        while j >= 0 and self._data[j][1] > iteration:
            j -= 1
        if j < 0 or self._data[j][1] != iteration:
            return None
        return [v for v, _ in self._data[max(0, j - window_size + 1) : j + 1]]

    def __len__(self) -> int:
        return len(self._data)


class EventStorage:
    """Scalars of a training run, keyed by name, each with its iteration.

    Use as a context manager so that hooks and the model can reach it through
    :func:`get_event_storage`::

        with EventStorage(start_iter) as storage:
            for storage.iter in range(start_iter, max_iter):
                ...
                storage.put_scalar("total_loss", loss)
    """

    def __init__(self, start_iter: int = 0):
        self._history: dict[str, HistoryBuffer] = defaultdict(HistoryBuffer)
        self._smoothing_hints: dict[str, bool] = {}
        self._latest_scalars: dict[str, tuple[float, int]] = {}
        self._iter = int(start_iter)

    # ---- writing ------------------------------------------------------------------------------
    def put_scalar(self, name: str, value, smoothing_hint: bool = True) -> None:
        """Record ``value`` (a number or one-element tensor) for ``name`` at the current iter.

        Args:
            smoothing_hint: whether writers should report a windowed median of this scalar
                (training losses, times) or its raw latest value (``False``: evaluation
                results, ETA). Must be the same every time a name is put.
        """
        # checks first: a put that raises records nothing (no empty history, no value)
        existing = self._smoothing_hints.get(name)
        if existing is not None and existing != smoothing_hint:
            raise ValueError(
                f"scalar {name!r} was put with smoothing_hint={existing} before and "
                f"smoothing_hint={smoothing_hint} now; use one hint per name."
            )
        if isinstance(value, torch.Tensor):
            # a global tensor's value, one element (no host read yet)
            value = _full(value.detach()).reshape(())
        else:
            value = float(value)
        self._history[name].update(value, self._iter)
        self._latest_scalars[name] = (name, self._iter)
        self._smoothing_hints[name] = smoothing_hint

    def put_scalars(self, *, smoothing_hint: bool = True, **kwargs) -> None:
        """``put_scalar`` for every ``name=value`` keyword, e.g. ``put_scalars(lm_loss=x)``."""
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint)

    # ---- reading ------------------------------------------------------------------------------
    def history(self, name: str) -> HistoryBuffer:
        """The :class:`HistoryBuffer` of ``name``; ``KeyError`` if it was never put."""
        if name not in self._history:
            raise KeyError(f"No history metric available for {name!r}!")
        return self._history[name]

    def histories(self) -> dict[str, HistoryBuffer]:
        """Every :class:`HistoryBuffer`, by name."""
        return dict(self._history)

    def latest(self) -> dict[str, tuple[float, int]]:
        """``name -> (latest value, iteration it was put at)`` for every scalar."""
        return {n: (self._history[n].latest(), itr) for n, (_, itr) in self._latest_scalars.items()}

    def latest_with_smoothing_hint(self, window_size: int = 20) -> dict[str, tuple[float, int]]:
        """Like :meth:`latest`, but smoothed scalars give their median over ``window_size``."""
        result = {}
        for name, (_, itr) in self._latest_scalars.items():
            buf = self._history[name]
            value = buf.median(window_size) if self._smoothing_hints[name] else buf.latest()
            result[name] = (value, itr)
        return result

    def scalars_at(self, iteration: int, window_size: int = 20) -> dict[str, float]:
        """Every scalar put at ``iteration``: its median over the ``window_size`` values up to
        it when smoothed, else its raw value. Used to write complete lines for past iterations.
        """
        result = {}
        for name, buf in self._history.items():
            window = buf.window_at(iteration, window_size)
            if window is not None:
                smooth = self._smoothing_hints[name]
                result[name] = float(np.median(window)) if smooth else window[-1]
        return result

    def smoothing_hints(self) -> dict[str, bool]:
        """``name -> smoothing_hint`` as given to :meth:`put_scalar`."""
        return dict(self._smoothing_hints)

    # ---- iteration ----------------------------------------------------------------------------
    def step(self) -> None:
        """Advance the iteration by one (alternative to assigning :attr:`iter`)."""
        self._iter += 1

    @property
    def iter(self) -> int:
        """The current 0-based iteration; scalars put now are recorded at it."""
        return self._iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._iter = int(value)

    @property
    def iteration(self) -> int:
        """Alias of :attr:`iter`."""
        return self._iter

    def __enter__(self) -> EventStorage:
        _CURRENT_STORAGE_STACK.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not _CURRENT_STORAGE_STACK or _CURRENT_STORAGE_STACK[-1] is not self:
            raise RuntimeError("EventStorage contexts must be exited in reverse order.")
        _CURRENT_STORAGE_STACK.pop()


# ---- writers --------------------------------------------------------------------------------
class EventWriter:
    """Base class of writers that report the current :class:`EventStorage`.

    ``self.enabled`` is true only on the main process, decided at construction: build
    writers after the process group exists (``setup_dist_util``), else every rank believes
    it is rank 0. Subclasses do nothing when it is false.
    """

    def __init__(self):
        self.enabled = _is_main_process()

    def write(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CommonMetricPrinter(EventWriter):
    """Print progress to the ``libai`` logger: iteration, ETA, losses, lr, time, tokens/s.

    Example line::

        eta: 0:03:12  iteration: 199/2000  total_loss: 5.123  lm_loss: 5.123
        time: 0.1034 s/iter  data_time: 0.0012 s/iter  tokens/s: 39612.4  lr: 1.000e-04

    Losses are every smoothed scalar whose name contains ``"loss"`` (median over
    ``window_size``); evaluation results (put with ``smoothing_hint=False``) are not repeated
    here. ``tokens/s`` needs ``tokens_per_iter`` (global batch x sequence length) and a
    ``time`` history; memory is shown when CUDA is available. Prints nothing when
    ``storage.iter >= max_iter`` (after training, e.g. the final evaluation) or when called
    twice at the same iteration.
    """

    def __init__(self, max_iter: int, window_size: int = 20, tokens_per_iter: int | None = None):
        super().__init__()
        self.logger = logging.getLogger(__name__)
        self._max_iter = max_iter
        self._window_size = window_size
        self._tokens_per_iter = tokens_per_iter
        self._last_write: tuple[int, float] | None = None
        self._last_printed: int | None = None

    def _eta(self, storage: EventStorage) -> str | None:
        iteration = storage.iter
        remaining = max(self._max_iter - iteration - 1, 0)
        try:
            eta_seconds = storage.history("time").median(1000) * remaining
            storage.put_scalar("eta_seconds", eta_seconds, smoothing_hint=False)
            return str(datetime.timedelta(seconds=int(eta_seconds)))
        except KeyError:
            # no per-iteration timer: estimate from the wall clock between two writes
            eta = None
            now = time.perf_counter()
            if self._last_write is not None and iteration > self._last_write[0]:
                per_iter = (now - self._last_write[1]) / (iteration - self._last_write[0])
                eta = str(datetime.timedelta(seconds=int(per_iter * remaining)))
            self._last_write = (iteration, now)
            return eta

    def write(self) -> None:
        if not self.enabled:
            return
        storage = get_event_storage()
        if storage.iter >= self._max_iter or storage.iter == self._last_printed:
            # after training (final evaluation) or twice at one step: nothing new to report
            return
        self._last_printed = storage.iter
        hints = storage.smoothing_hints()
        window = self._window_size

        def windowed(name):
            try:
                return storage.history(name).avg(window)
            except KeyError:
                return None

        iter_time, data_time = windowed("time"), windowed("data_time")
        try:
            lr = f"{storage.history('lr').latest():.3e}"
        except KeyError:
            lr = "N/A"
        eta = self._eta(storage)
        losses = "  ".join(
            f"{name}: {buf.median(window):.4g}"
            for name, buf in storage.histories().items()
            if "loss" in name and hints.get(name, True)
        )
        parts = []
        if eta:
            parts.append(f"eta: {eta}")
        parts.append(f"iteration: {storage.iter}/{self._max_iter}")
        if losses:
            parts.append(losses)
        if iter_time is not None:
            parts.append(f"time: {iter_time:.4f} s/iter")
        if data_time is not None:
            parts.append(f"data_time: {data_time:.4f} s/iter")
        if iter_time and self._tokens_per_iter:
            parts.append(f"tokens/s: {self._tokens_per_iter / iter_time:.1f}")
        parts.append(f"lr: {lr}")
        if torch.cuda.is_available():
            parts.append(f"max_mem: {torch.cuda.max_memory_allocated() / 2**20:.0f}M")
        self.logger.info("  ".join(parts))


class JSONWriter(EventWriter):
    """Append scalars to ``json_file``: one JSON object per iteration, one per line.

    A line for iteration ``i`` holds ``iteration`` and every scalar put at ``i`` (smoothed
    ones as the median of the ``window_size`` values up to ``i``), e.g.::

        {"data_time": 0.0011, "iteration": 19, "lm_loss": 5.1, "lr": 0.0001, "time": 0.10,
         "total_loss": 5.1}

    Each ``write()`` emits a line for the iteration of every scalar whose latest value was
    not written yet: normally the current iteration; also an earlier one when evaluation
    results were put there between two writes (that line then carries the training scalars
    of the same iteration, too). A scalar put at an iteration whose line was already written
    (a hook that ran after the writer) yields a second, complete line for that iteration;
    readers keep the last line of an iteration (:func:`iter_metrics` does).

    The file is opened in append mode, so a resumed run continues it. Read it back with
    :func:`iter_metrics`, or ``[json.loads(line) for line in open(path)]``.
    """

    def __init__(self, json_file: str, window_size: int = 20):
        super().__init__()
        self._path = json_file
        self._window_size = window_size
        self._written: dict[str, int] = {}  # name -> last iteration written
        self._file = None
        if self.enabled:
            parent = os.path.dirname(os.path.abspath(json_file))
            os.makedirs(parent, exist_ok=True)
            self._file = open(json_file, "a")  # lives as long as the writer

    def write(self) -> None:
        if self._file is None:
            return
        storage = get_event_storage()
        pending = sorted(
            {
                itr
                for name, (_, itr) in storage.latest().items()
                if itr > self._written.get(name, -1)
            }
        )
        for itr in pending:
            scalars = storage.scalars_at(itr, self._window_size)
            self._file.write(json.dumps({"iteration": itr, **scalars}, sort_keys=True) + "\n")
            for name in scalars:
                self._written[name] = max(self._written.get(name, -1), itr)
        self._file.flush()
        try:
            os.fsync(self._file.fileno())
        except (AttributeError, OSError):
            pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorboardXWriter(EventWriter):
    """Write the latest scalars (smoothed as in :class:`JSONWriter`) as TensorBoard events.

    Args:
        log_dir: directory of the event files (usually ``output_dir``).
        window_size: median window of smoothed scalars.
        kwargs: passed to :class:`torch.utils.tensorboard.SummaryWriter`.
    """

    def __init__(self, log_dir: str, window_size: int = 20, **kwargs):
        super().__init__()
        self._window_size = window_size
        self._written: dict[str, int] = {}  # name -> last iteration written
        self._writer = None
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only rank 0

            self._writer = SummaryWriter(log_dir, **kwargs)

    def write(self) -> None:
        if self._writer is None:
            return
        storage = get_event_storage()
        for name, (value, itr) in storage.latest_with_smoothing_hint(self._window_size).items():
            if itr > self._written.get(name, -1):  # per name: late scalars are not dropped
                self._writer.add_scalar(name, value, itr)
                self._written[name] = itr
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def iter_metrics(json_file: str) -> Iterator[dict]:
    """The records of a ``metrics.json``, skipping a torn last line (a killed process).

    Where an iteration appears more than once (a resumed run re-did it) the later record
    wins; records are yielded in iteration order.
    """
    by_iter: dict[int, dict] = {}
    with open(json_file) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "iteration" in record:
                by_iter[int(record["iteration"])] = record
    for itr in sorted(by_iter):
        yield by_iter[itr]
