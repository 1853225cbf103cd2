"""FleetX's ``Profiler`` section as ``torch.profiler`` over training steps.

::

    Profiler:
      enable: True
      scheduler: [1, 5]          # profile steps [1, 5) of the run (FleetX's [start, end))
      profiler_log: profiler_log # where the traces go: under Engine.save_load.output_dir
      detailed: False            # True: the summary table lists more ops, with shapes
      record_shapes: True        # FleetX's defaults
      profile_memory: True

Each rank writes a Chrome trace (``trace_rank<N>.json``, open it in chrome://tracing or
Perfetto) when the profiled window closes, and rank 0 logs the table of the busiest ops.
A relative ``profiler_log`` lives under the run's output directory (FleetX writes it in the
working directory; this library writes only under ``output_dir``).
"""

from __future__ import annotations

import logging
import os

import torch

from libai import dist
from libai.runtime.trainer import HookBase

logger = logging.getLogger(__name__)

__all__ = ["ProfilerHook", "profiler_hook"]


def _window(scheduler, key: str = "Profiler.scheduler") -> tuple[int, int]:
    if scheduler is None:
        return 1, 5
    steps = list(scheduler)
    if (
        len(steps) != 2
        or not all(isinstance(s, int) for s in steps)
        or not 0 <= steps[0] < steps[1]
    ):
        raise ValueError(f"{key} must be [start, end) steps with 0 <= start < end, got {steps}")
    return steps[0], steps[1]


class ProfilerHook(HookBase):
    """Profiles the training steps ``[start, end)`` with ``torch.profiler`` (CPU, and CUDA
    when the run is on a GPU); the trace is written when the window closes."""

    def __init__(self, trace_dir: str, start: int, end: int, *, detailed=False, **options):
        self.trace_dir, self.start, self.end = trace_dir, start, end
        self.detailed, self.options = bool(detailed), options
        self.profiler: torch.profiler.profile | None = None
        self.trace_path: str | None = None

    def before_train(self):
        os.makedirs(self.trace_dir, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dist.get_dist_util().layout.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        first = self.trainer.iter  # a resumed run counts from its start step
        wait = max(0, self.start - first)
        active = self.end - max(self.start, first)
        if active <= 0:
            logger.info("Profiler: steps [%d, %d) were already run; nothing to profile", *self._w)
            return
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=0, active=active, repeat=1),
            on_trace_ready=self._write,
            **self.options,
        )
        self.profiler.start()
        logger.warning(
            "Profiler is enabled (steps %d to %d): do not enable it in production",
            self.start,
            self.end,
        )

    @property
    def _w(self):
        return self.start, self.end

    def _write(self, prof) -> None:
        self.trace_path = os.path.join(self.trace_dir, f"trace_rank{dist.get_rank()}.json")
        prof.export_chrome_trace(self.trace_path)
        if dist.get_rank() == 0:
            rows = 40 if self.detailed else 15
            table = prof.key_averages(group_by_input_shape=self.detailed).table(
                sort_by="self_cpu_time_total", row_limit=rows
            )
            logger.info(
                "Profiler: steps [%d, %d), trace %s\n%s",
                self.start,
                self.end,
                self.trace_path,
                table,
            )

    def after_step(self):
        if self.profiler is not None:
            self.profiler.step()

    def after_train(self):
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None


def profiler_hook(cfg) -> ProfilerHook | None:
    """The hook of ``cfg.Profiler`` when it is enabled (else ``None``)."""
    section = cfg.get("Profiler")
    if not section or not section.get("enable"):
        return None
    start, end = _window(section.get("scheduler"))
    log_dir = str(section.get("profiler_log") or "profiler_log")
    if not os.path.isabs(log_dir):
        log_dir = os.path.join(cfg.Engine.save_load.output_dir or ".", log_dir)
    return ProfilerHook(
        log_dir,
        start,
        end,
        detailed=section.get("detailed", False),
        record_shapes=bool(section.get("record_shapes", True)),
        profile_memory=bool(section.get("profile_memory", True)),
    )
