"""Rapidformer's templates: subclass :class:`Finetuner` or :class:`PreTrainer`, fill in the
providers, and ``train()`` runs the core's loop with the command line's switches.

::

    class MyFinetuner(Finetuner):
        def train_valid_test_datasets_provider(self):
            return train_dataset, valid_dataset            # (, test_dataset, collate_fn)
        def model_optimizer_lr_scheduler_provider(self):
            return AutoModelForSequenceClassification.from_pretrained(DIR), None, None
        def run_forward_step(self, batch, model):
            return model(**batch).loss
        def run_compute_metrics(self, model, eval_dataloader):
            correct = total = 0
            for batch in eval_dataloader:
                pred = model(**batch).logits.argmax(-1)
                correct += (self.gather(pred) == self.gather(batch["labels"])).sum().item()
                total += self.gather(batch["labels"]).numel()
            return {"accuracy": correct / total}

    MyFinetuner(engine=AccelerateEngine()).train()

Run a template file with the black box's switches: ``libai-accelerate --user-script my.py
--micro-batch-size 8 --epochs 3 --mixed-precision ...``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from libai.models.contract import total_loss
from libai.runtime.evaluate import eval_mode
from libai.runtime.evaluate import evaluate as run_evaluation
from libai.runtime.trainer import to_device

logger = logging.getLogger(__name__)

__all__ = ["Finetuner", "ModelChunks", "PreTrainer", "model_loss", "trainings"]

#: how many times a template's ``train()`` ran in this process (``--user-script`` trains a
#: script's template class only when the script did not train it itself)
_TRAININGS = [0]


def trainings() -> int:
    """How many times a template's ``train()`` started in this process."""
    return _TRAININGS[0]


class ModelChunks(list):
    """The model as Rapidformer / Megatron hand it to ``run_compute_metrics``: a list of
    model chunks (one here: ``model[0]``), itself callable as that model, so templates that
    call ``model(**batch)`` directly work too."""

    def __call__(self, *args, **kwargs):
        return self[0](*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self[0], name)


def model_loss(out) -> torch.Tensor:
    """The loss of a model's output: a tensor, a transformers output's ``.loss``, or the sum
    of a mapping's ``*loss*`` entries (the libai model contract)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and any("loss" in k and v is not None for k, v in out.items()):
        return total_loss(out)
    loss = getattr(out, "loss", None)
    if loss is None:
        raise TypeError(f"the forward step returned no loss ({type(out).__name__})")
    return loss


class _DeviceLoader:
    """Iterates a loader with the batches on the run's device."""

    def __init__(self, loader, device, max_batches: int = 0):
        self.loader, self.device, self.max_batches = loader, device, max_batches
        self.dataset = getattr(loader, "dataset", None)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if self.max_batches and i >= self.max_batches:
                return
            yield to_device(batch, self.device)


class Finetuner:
    """The fine-tuning template (Rapidformer's contract; see the module doc).

    Override ``train_valid_test_datasets_provider()`` and
    ``model_optimizer_lr_scheduler_provider()``; ``run_forward_step`` defaults to the model's
    own loss, ``run_compute_metrics`` to the evaluation loss.
    """

    def __init__(self, engine):
        self.engine = engine
        self.args = engine.args
        self.model = None

    # ---- what a subclass provides ---------------------------------------------------------
    def train_valid_test_datasets_provider(self):
        """``(train, valid)``, ``(train, valid, test)`` or ``(train, valid, test,
        collate_fn)``: map-style datasets of dicts of tensors (``valid`` may be None)."""
        raise NotImplementedError

    def model_optimizer_lr_scheduler_provider(self):
        """``(model, optimizer, lr_scheduler)``; ``None`` s are built from the flags."""
        raise NotImplementedError

    def run_forward_step(self, batch, model) -> torch.Tensor:
        """The loss of one micro-batch (default: the model's own, ``model(**batch)``)."""
        return model_loss(model(**batch))

    def run_compute_metrics(self, model, eval_dataloader) -> dict:
        """Metrics on the evaluation set; ``model`` is Rapidformer's list of model chunks
        (:class:`ModelChunks`: ``model[0]`` is the model). Default: the mean loss over all
        data ranks, by the runtime's evaluation loop with ``run_forward_step``."""
        model = model[0] if isinstance(model, list) else model
        run = run_evaluation(
            self.engine.runner, eval_dataloader, step=lambda b: self.run_forward_step(b, model)
        )
        return {"loss": run.loss}

    # ---- helpers ----------------------------------------------------------------------------
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of every data-parallel rank, concatenated along dim 0."""
        return self.engine.gather(tensor)

    def build_data_loader(self, dataset, *, train: bool | None = None, collate_fn=None):
        """This rank's loader of ``dataset``, batches on the device (see
        :meth:`AccelerateEngine.build_data_loader`: shuffled epochs for training; one pass in
        order for evaluation, the default for a ``datasets`` validation / test split)."""
        return self.engine.build_data_loader(dataset, train=train, collate_fn=collate_fn)

    def batch_transform(self, batch):
        """Applied to every batch on the device before the step (default: unchanged)."""
        return batch

    # ---- the run ----------------------------------------------------------------------------
    def _datasets(self):
        provided = tuple(self.train_valid_test_datasets_provider())
        if not 2 <= len(provided) <= 4:
            raise ValueError(
                "train_valid_test_datasets_provider must return (train, valid), (train, valid, "
                f"test) or (train, valid, test, collate_fn); got {len(provided)} values"
            )
        train, valid = provided[0], provided[1]
        collate = provided[3] if len(provided) == 4 else None
        return train, valid, collate

    def _train_iters(self, train_dataset) -> int:
        a = self.args
        if a.train_iters:
            return int(a.train_iters)
        if not a.epochs:
            raise ValueError("give --train-iters or --epochs (the length of the run)")
        steps = len(train_dataset) // a.global_batch_size
        if steps < 1:
            raise ValueError(
                f"the training set has {len(train_dataset)} samples, fewer than one global batch "
                f"(--global-batch-size {a.global_batch_size})"
            )
        return a.epochs * steps

    def _loss_fn(self):
        """The runner's loss function: ``run_forward_step`` when a subclass replaced it
        (not under pipeline parallel), else the model contract."""
        if type(self).run_forward_step is Finetuner.run_forward_step:
            return None
        if self.engine.util.layout.pipeline_parallel_size > 1:
            raise ValueError(
                f"{type(self).__name__}.run_forward_step cannot run split over pipeline stages; "
                "keep the default (the model's own loss) or drop --pipeline-model-parallel-size"
            )
        return lambda batch: model_loss(self.run_forward_step(batch, self.engine.runner.model))

    def evaluate(self, valid_loader) -> dict:
        """``run_compute_metrics`` on the evaluation set, in eval mode, without gradients;
        under pipeline parallel (each rank holds its stages) the runtime's evaluation loop
        scores the pipeline's own loss (:meth:`pipeline_metrics`)."""
        runner = self.engine.runner
        if runner.pipeline:
            run = run_evaluation(
                runner, valid_loader, max_batches=self.args.eval_iters, prepare=self.batch_transform
            )
            results = self.pipeline_metrics(run)
        else:
            loader = _DeviceLoader(valid_loader, self.engine.util.device, self.args.eval_iters)
            with eval_mode(runner.model), runner.autocast():
                results = self.run_compute_metrics(ModelChunks([runner.model]), loader)
        logger.info("Evaluation: %s", results)
        return {f"eval_{k}": float(v) for k, v in (results or {}).items()}

    def pipeline_metrics(self, run) -> dict:
        """The metrics of a pipeline-parallel evaluation (a runtime ``EvalResult``)."""
        return {"loss": run.loss}

    def train(self):
        """Build the datasets, model, optimizer and schedule from the providers (and the
        flags), then run the core's loop; returns the trained model."""
        _TRAININGS[0] += 1
        train, valid, collate = self._datasets()
        train_iter = self._train_iters(train)
        model, optimizer, scheduler = self.model_optimizer_lr_scheduler_provider()
        valid_loader = None
        if valid is not None:
            valid_loader = self.engine.build_data_loader(valid, train=False, collate_fn=collate)
        evaluate = (lambda: self.evaluate(valid_loader)) if valid_loader is not None else None
        self.model = self.engine.fit(
            model,
            optimizer,
            scheduler,
            train,
            train_iter=train_iter,
            loss_fn=self._loss_fn(),
            evaluate=evaluate,
            collate_fn=collate,
            batch_transform=self.batch_transform,
        )
        return self.model


class PreTrainer(Finetuner):
    """The pretraining template: ``train_valid_test_datasets_provider(
    train_val_test_num_samples)`` gets the sample counts the run needs (``--train-iters`` x
    global batch, ``--eval-iters`` x global batch); ``run_forward_step(data_iterator, model)``
    reads its micro-batch with ``next(data_iterator)`` and returns the loss, or Megatron's
    ``(output_tensor, loss_func)`` where ``loss_func(output_tensor)`` is the loss (or
    ``(loss, logs)``)."""

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        raise NotImplementedError

    def run_forward_step(self, data_iterator, model):
        return model_loss(model(**next(data_iterator)))

    def _datasets(self):
        a = self.args
        if not a.train_iters:
            raise ValueError("pretraining needs --train-iters (a number of steps, not epochs)")
        samples = [a.train_iters * a.global_batch_size, a.eval_iters * a.global_batch_size, 0]
        provided = tuple(self.train_valid_test_datasets_provider(samples))
        train, valid = provided[0], provided[1]
        return train, valid, provided[3] if len(provided) == 4 else None

    def _loss_fn(self):
        if type(self).run_forward_step is PreTrainer.run_forward_step:
            return None
        if self.engine.util.layout.pipeline_parallel_size > 1:
            raise ValueError(
                f"{type(self).__name__}.run_forward_step cannot run split over pipeline stages"
            )

        def loss_fn(batch):
            out = self.run_forward_step(iter([batch]), self.engine.runner.model)
            if isinstance(out, tuple) and len(out) == 2 and callable(out[1]):
                out = out[1](out[0])
                out = out[0] if isinstance(out, tuple) else out
            return model_loss(out)

        return loss_fn

    def run_compute_metrics(self, model, eval_dataloader) -> dict:
        loss_fn = self._loss_fn()
        run = run_evaluation(
            self.engine.runner,
            eval_dataloader,
            step=lambda batch: loss_fn(batch) if loss_fn else model_loss(model(**batch)),
        )
        return {"loss": run.loss, "perplexity": float(torch.tensor(run.loss).exp())}
