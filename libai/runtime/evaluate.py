"""The one evaluation loop of the runtime, used by every front door.

:func:`evaluate` runs a loader through a :class:`~libai.runtime.parallel.ModelRunner` in
eval mode without gradients and returns the mean loss and metric sums of every
data-parallel rank. Under pipeline parallel the batch goes through the schedule
(``runner.eval_loss``: a smaller last batch is padded and scored on its real rows); without
it a door may score batches with its own ``step`` (a task module's ``validation_step``).
The doors keep only their syntax: which step to call, what to log per batch, how to name
the results.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from libai.evaluation.utils import all_reduce_over_data_parallel
from libai.models.contract import total_loss
from libai.runtime.pipeline_split import pipeline_target
from libai.runtime.trainer import to_device

__all__ = ["EvalResult", "eval_mode", "evaluate", "step_loss_and_sums", "sum_over_ranks"]


@dataclass
class EvalResult:
    """What :func:`evaluate` measured, summed over every data-parallel rank."""

    #: mean of the per-batch mean losses
    loss: float
    #: batches scored (all data-parallel ranks together)
    batches: int
    #: per-batch numbers a step returned besides its loss, summed over batches and ranks
    sums: dict = field(default_factory=dict)
    #: wall time of the loop on this rank
    seconds: float = 0.0


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """``model`` in eval mode without gradients; its training mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def step_loss_and_sums(out, sums: dict) -> torch.Tensor:
    """The loss of an evaluation step's output: a loss tensor, or a mapping with ``loss``
    (else the sum of its entries whose key contains "loss", as the model contract sums
    them). The mapping's other numbers are added into ``sums``."""
    if isinstance(out, torch.Tensor):
        return out.detach().float()
    if not isinstance(out, Mapping):
        raise TypeError(
            "an evaluation step must return a loss tensor or a mapping with a loss entry, "
            f"got {type(out).__name__}"
        )
    loss = out["loss"] if "loss" in out else total_loss(out)
    for key, value in out.items():
        if "loss" in key or value is None:
            continue
        value = value.detach().float().sum() if isinstance(value, torch.Tensor) else value
        sums[key] = sums.get(key, 0.0) + float(value)
    return loss.detach().float()


def sum_over_ranks(values: Iterable[float], device) -> list[float]:
    """``values`` summed over the data-parallel ranks and the pipeline stages (the other
    stages contribute zeros); tensor-parallel peers hold the same numbers already."""
    totals = torch.tensor(list(values), dtype=torch.float64, device=device)
    return all_reduce_over_data_parallel(totals).tolist()


def evaluate(
    runner,
    loader: Iterable,
    *,
    max_batches: int = 0,
    prepare: Callable | None = None,
    step: Callable | None = None,
    predictions: bool = False,
    on_batch: Callable | None = None,
) -> EvalResult:
    """Score at most ``max_batches`` batches of ``loader`` (all when 0) with ``runner``.

    Each batch is moved to the rank's device and passed through ``prepare`` (a door's batch
    translation). Its loss is, in this order:

    * ``predictions``: ``runner.predict`` (the last stage's logits, ``None`` elsewhere) and
      the model's ``pipeline_loss`` on them; ``on_batch`` gets the logits;
    * ``step`` (without pipeline or context parallel, where it would see whole batches on
      ranks that run stages or sequence shards): ``step(batch)`` under the runner's autocast, a
      loss tensor or a mapping (see :func:`step_loss_and_sums`);
    * otherwise ``runner.eval_loss(batch)``, the pipeline schedule under pp.

    ``on_batch(index, batch, loss, logits)`` is called after each batch (``loss`` is
    ``None`` on stages that hold no output). The totals are summed once at the end over the
    data-parallel ranks and pipeline stages, so every rank returns the same result.
    """
    model = runner.model
    device = runner.util.device
    # the ranks that count a batch: the last stage holds the loss (eval_loss copies it to
    # every stage; counting it there once keeps one reduction for every path)
    counts = not runner.pipeline or runner.is_last
    own_step = step is not None and not runner.pipeline and runner.util.cp_group is None
    start = time.perf_counter()
    loss_sum, batches, sums = 0.0, 0, {}
    with eval_mode(model):
        for index, batch in enumerate(loader):
            if max_batches and index >= max_batches:
                break
            batch = to_device(batch, device)
            if prepare is not None:
                batch = prepare(batch)
            logits = None
            if predictions:
                logits = runner.predict(batch)
                loss = None
                if logits is not None and not isinstance(logits, Mapping):
                    loss = model.pipeline_loss(logits, pipeline_target(model, batch)).float()
            elif own_step:
                with runner.autocast():
                    loss = step_loss_and_sums(step(batch), sums)
            else:
                loss = runner.eval_loss(batch)
            if counts and loss is not None:
                loss_sum, batches = loss_sum + float(loss), batches + 1
            if on_batch is not None:
                on_batch(index, batch, loss, logits)
    keys = sorted(sums)
    totals = sum_over_ranks([loss_sum, batches, *(sums[k] for k in keys)], device)
    return EvalResult(
        loss=totals[0] / max(totals[1], 1),
        batches=int(totals[1]),
        sums=dict(zip(keys, totals[2:])),
        seconds=time.perf_counter() - start,
    )
