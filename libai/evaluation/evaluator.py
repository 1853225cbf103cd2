"""The evaluator protocol and the loop that runs a model over a test set.

An evaluator accumulates statistics batch by batch (:meth:`DatasetEvaluator.process`) and
turns them into metrics at the end (:meth:`DatasetEvaluator.evaluate`). Evaluators here
reduce their statistics over data-parallel ranks inside ``evaluate``, so **every rank must
call evaluate()** (it runs collectives when dp > 1) and every rank gets the same results --
the trainer may act on them (e.g. best-checkpoint decisions) on all ranks alike.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from libai import dist
from libai.utils.logger import log_every_n_seconds

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "inference_on_dataset"]

logger = logging.getLogger(__name__)


class DatasetEvaluator:
    """Base class of a dataset evaluator.

    :func:`inference_on_dataset` calls :meth:`reset` once, :meth:`process` for every batch
    and :meth:`evaluate` at the end.
    """

    #: reads the model's predictions (``outputs["logits"]``), not only its loss: the trainer
    #: then runs a predicting forward for it
    needs_predictions: bool = False

    def reset(self) -> None:
        """Forget everything processed so far (called before a round of evaluation)."""

    def process(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]):
        """Accumulate one batch.

        Args:
            inputs: the batch given to the model, ``model(**inputs)`` (e.g. ``input_ids``,
                ``labels``): this rank's share of the global batch.
            outputs: what the model returned for it (a dict, e.g. ``lm_loss``, ``logits``).
        """

    def evaluate(self) -> dict:
        """Metrics over everything processed, e.g. ``{"ppl": 12.3, "loss": 2.51}``.

        Collective over data-parallel ranks: call it on every rank.
        """
        return {}


class DatasetEvaluators(DatasetEvaluator):
    """Several evaluators run as one; their results are merged into one dict."""

    def __init__(self, evaluators: Sequence[DatasetEvaluator]):
        super().__init__()
        self._evaluators = list(evaluators)
        self.needs_predictions = any(
            getattr(e, "needs_predictions", False) for e in self._evaluators
        )

    def reset(self) -> None:
        for evaluator in self._evaluators:
            evaluator.reset()

    def process(self, inputs, outputs) -> None:
        for evaluator in self._evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self) -> dict:
        results = OrderedDict()
        for evaluator in self._evaluators:  # same order on every rank: collectives match
            result = evaluator.evaluate() or {}
            for key, value in result.items():
                if key in results:
                    raise KeyError(
                        f"Different evaluators produce results with the same key {key!r}"
                    )
                results[key] = value
        return results


def _model_device(model) -> torch.device | None:
    if isinstance(model, nn.Module):
        for p in model.parameters():
            return p.device
    return None


def _to_device(batch, device: torch.device | None):
    if device is None:
        return batch
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


def inference_on_dataset(
    model: Callable,
    data_loader: Iterable,
    evaluator: DatasetEvaluator | Sequence[DatasetEvaluator] | None,
    eval_iter: int | None = None,
    get_batch: Callable[[object], Mapping[str, torch.Tensor]] | None = None,
) -> dict:
    """Run ``model`` over ``data_loader`` in eval mode without gradients; return the metrics.

    Args:
        model: an ``nn.Module`` (put in eval mode for the duration, then restored) or any
            callable ``model(**batch) -> dict``. A callable may return ``None`` for a batch
            whose outputs live elsewhere (a non-last pipeline stage); such batches are not
            processed on this rank.
        data_loader: an iterable of batches (this rank's share under data parallelism).
            Under dp > 1 with FSDP every rank must see the same number of batches.
        evaluator: one evaluator, a list of them (merged), or ``None`` (benchmark only).
        eval_iter: evaluate at most this many batches (LiBai's ``train.evaluation.eval_iter``).
        get_batch: turns a data-loader element into the keyword dict of the model. Default:
            the element itself (a mapping), tensors moved to the model's device.

    Returns:
        ``evaluator.evaluate()``, equal on every rank.

    Pipeline parallelism is out of scope of this loop: with pp > 1 a plain module holds only
    this rank's stage, so pass a callable that runs the pipeline schedule forward (returning
    the outputs dict on the last stage and ``None`` elsewhere) -- the evaluators count the
    non-last stages as zero and sum over the pipeline group.
    """
    if isinstance(model, nn.Module) and dist.get_world_size() > 1:
        if dist.get_pipeline_parallel_size() > 1:
            raise ValueError(
                "inference_on_dataset got a plain nn.Module with pipeline_parallel_size > 1: "
                "this rank holds one pipeline stage only. Pass a callable that runs the "
                "pipeline forward (outputs on the last stage, None elsewhere)."
            )
    if evaluator is None:
        evaluator = DatasetEvaluators([])
    elif isinstance(evaluator, Sequence):
        evaluator = DatasetEvaluators(evaluator)
    try:
        total = len(data_loader)
    except TypeError:
        total = None
    if eval_iter is not None:
        if eval_iter < 1:
            raise ValueError(f"eval_iter must be a positive number of batches, got {eval_iter}")
        total = eval_iter if total is None else min(total, eval_iter)
    device = _model_device(model) if get_batch is None else None
    if get_batch is None:

        def get_batch(data):
            if not isinstance(data, Mapping):
                raise TypeError(
                    "inference_on_dataset: data loader elements must be dicts of model "
                    f"inputs (got {type(data).__name__}); pass get_batch= to convert them."
                )
            return _to_device(data, device)

    logger.info(f"Start inference on {total if total is not None else 'all'} batches")
    evaluator.reset()
    was_training = model.training if isinstance(model, nn.Module) else None
    if was_training:
        model.eval()
    num_warmup = min(5, total - 1) if total else 0
    start = time.perf_counter()
    data_time = compute_time = eval_time = 0.0
    done = 0
    try:
        with torch.no_grad():
            data_start = time.perf_counter()
            for idx, data in enumerate(data_loader):
                if total is not None and idx >= total:
                    break
                data_time += time.perf_counter() - data_start
                if idx == num_warmup:  # time only the steady state
                    start = time.perf_counter()
                    data_time = compute_time = eval_time = 0.0
                compute_start = time.perf_counter()
                batch = get_batch(data)
                outputs = model(**batch)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                compute_time += time.perf_counter() - compute_start
                eval_start = time.perf_counter()
                if outputs is not None:
                    evaluator.process(batch, outputs)
                eval_time += time.perf_counter() - eval_start
                done = idx + 1
                timed = done - num_warmup * int(idx >= num_warmup)
                per_iter = (time.perf_counter() - start) / timed
                if total is not None and (idx >= num_warmup * 2 or compute_time / timed > 5):
                    eta = datetime.timedelta(seconds=int(per_iter * (total - done)))
                    log_every_n_seconds(
                        logging.INFO,
                        f"Inference done {done}/{total}. Dataloading: {data_time / timed:.4f} "
                        f"s/iter. Inference: {compute_time / timed:.4f} s/iter. Eval: "
                        f"{eval_time / timed:.4f} s/iter. Total: {per_iter:.4f} s/iter. ETA={eta}",
                        n=5,
                        name=__name__,
                    )
                data_start = time.perf_counter()
    finally:
        if was_training:
            model.train()
    timed = max(done - num_warmup if done > num_warmup else done, 1)
    total_time = time.perf_counter() - start
    logger.info(
        f"Total inference time: {datetime.timedelta(seconds=int(total_time))} "
        f"({total_time / timed:.6f} s / iter per device, on {dist.get_world_size()} devices); "
        f"pure compute {compute_time / timed:.6f} s / iter, {done} batches"
    )
    results = evaluator.evaluate()
    return {} if results is None else results
