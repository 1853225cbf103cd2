"""FleetX's ``Engine``: fit / evaluate / predict / save / load / export / inference of a task
:class:`~libai.fleetx.module.BasicModule`, on the same core as ``DefaultTrainer``.

The Engine is a front door, not a second trainer: it translates the YAML config into LiBai's
``train`` namespace (:func:`~libai.fleetx.yaml_setup.train_namespace`) and builds the
runner, ZeRO, checkpointer, hooks and writers with :mod:`libai.runtime.core`; ``fit`` runs
:class:`~libai.runtime.trainer.EagerTrainer`, the loop ``tools/train_net.py`` runs. The
module's ``training_step`` / ``backward`` become the runner's loss and backward functions,
``pretreating_batch`` its batch transform, and the logging hooks are called by
:class:`ModuleCallbacks`.

Modes: ``train`` builds everything; ``eval`` / ``inference`` no optimizer; ``export`` no
optimizer and no mixed precision.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from libai import dist
from libai.fleetx.module import BasicModule
from libai.fleetx.module_hooks import ModuleCallbacks, overridden
from libai.fleetx.profiler import profiler_hook
from libai.fleetx.yaml_setup import amp_settings, train_namespace
from libai.runtime.core import resolve_compile
from libai.runtime.evaluate import evaluate as run_evaluation
from libai.runtime.run import Run
from libai.runtime.trainer import EagerTrainer, to_device
from libai.utils.plot import plot_loss_curve

logger = logging.getLogger(__name__)

__all__ = ["Engine"]

MODES = ("train", "eval", "export", "inference")
#: module hooks that cannot run split over pipeline stages: an error to override under pp
_STEP_HOOKS = ("training_step", "backward", "forward")
#: ... and those the pipeline's own loss replaces in evaluation (a warning)
_EVAL_HOOKS = ("validation_step", "test_step")


class Engine:
    """Run a task module with every switch of its YAML config (see the module doc).

    Args:
        cfg: a config from :func:`~libai.fleetx.yaml_config.load_yaml_config`, set up with
            :func:`~libai.fleetx.yaml_setup.setup_yaml_run` (the mesh exists).
        module: the task module (its model built on that mesh).
        mode: ``"train"``, ``"eval"``, ``"export"`` or ``"inference"``.
    """

    def __init__(self, cfg, module: BasicModule, mode: str = "train"):
        if mode not in MODES:
            raise ValueError(f"Engine mode must be one of {MODES}, got {mode!r}")
        if not isinstance(module, BasicModule):
            raise TypeError(f"Engine needs a libai.engine.BasicModule, got {type(module).__name__}")
        self.cfg, self.module, self.mode = cfg, module, mode
        self.util = dist.get_dist_util()
        self._check_module()
        self.tokenizer = getattr(module, "tokenizer", None)
        engine = cfg.Engine
        self.global_batch_size = int(cfg.Global.global_batch_size)
        self.local_batch_size = int(cfg.Global.local_batch_size)
        self.train_loader = self.valid_loader = self.test_loader = None
        if mode == "train":
            self.train_loader = self._build_loader("Train", self._train_samples())
        if mode in ("train", "eval") and cfg.Data.get("Eval") is not None:
            self.valid_loader = self._build_loader("Eval", self._eval_samples(engine.eval_iters))
        if cfg.Data.get("Test") is not None and mode != "export":
            self.test_loader = self._build_loader("Test", self._eval_samples(engine.test_iters))
        self.steps_per_epoch = self._epoch_steps(self.train_loader)
        self.max_iter = self._max_iter(self.steps_per_epoch, engine.num_train_epochs)
        self.train_cfg = train_namespace(
            cfg,
            train_iter=self.max_iter,
            steps_per_epoch=self.steps_per_epoch,
            mode=mode,
            has_eval=self.valid_loader is not None,
        )
        custom = not self.util.layout.pipeline_parallel_size > 1
        _, _, op_lists = amp_settings(cfg, mode)
        self.run = Run(
            module.model,
            self.train_cfg,
            optimizer_fn=self._build_optimizer if mode == "train" else None,
            lr_scheduler_fn=self._build_lr_scheduler,
            compile=resolve_compile(engine.compile, self.util.layout.device_type)
            and mode != "export",
            loss_fn=module.training_step
            if custom and overridden(module, "training_step")
            else None,
            backward_fn=module.backward if custom and overridden(module, "backward") else None,
            autocast_op_lists=op_lists,
            resume_hint=(
                f"resume it with -o Engine.save_load.ckpt_dir={engine.save_load.output_dir}"
            ),
            length_key="Engine.max_steps",
        )
        self.parts, self.runner = self.run.parts, self.run.runner
        self.optimizer, self.lr_scheduler = self.run.optimizer, self.run.lr_scheduler
        self.checkpointer = self.run.checkpointer
        self.trainer: EagerTrainer | None = None

    #: the step :meth:`fit` continues from and the samples consumed so far (the run's)
    start_iter = property(lambda self: self.run.start_iter)
    consumed_train_samples = property(lambda self: self.run.consumed_train_samples)

    # ---- building -----------------------------------------------------------------------------
    def _check_module(self) -> None:
        module, layout = self.module, self.util.layout
        model = getattr(module, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{type(module).__name__}.get_model() must return an nn.Module")
        inside = {id(p) for p in model.parameters()}
        outside = [n for n, p in module.named_parameters() if id(p) not in inside]
        if outside:
            raise ValueError(
                f"{type(module).__name__} holds parameters outside self.model ({outside[:3]}): "
                "the Engine parallelizes, optimizes and checkpoints self.model; move them there"
            )
        cp = layout.context_parallel_size
        own = [h for h in (*_STEP_HOOKS, *_EVAL_HOOKS) if overridden(module, h)]
        if cp > 1 and own:
            raise ValueError(
                f"{type(module).__name__} overrides {', '.join(own)}: under context parallel "
                f"(Distributed.cp_degree={cp}) each rank runs its share of every sequence "
                "through the model's own loss, which these hooks replace; keep the defaults "
                "(the model contract) or set cp_degree: 1"
            )
        if layout.pipeline_parallel_size > 1:
            custom = [h for h in _STEP_HOOKS if overridden(module, h)]
            if custom:
                raise ValueError(
                    f"{type(module).__name__} overrides {', '.join(custom)}: under pipeline "
                    "parallel (Distributed.pp_degree > 1) the loss comes from the model's "
                    "pipeline_loss on the last stage and these hooks cannot run split over "
                    "stages; keep the defaults (the model contract) or set pp_degree: 1"
                )
            replaced = [h for h in _EVAL_HOOKS if overridden(module, h)]
            if replaced:
                logger.warning(
                    "pipeline parallel: evaluation uses the model's pipeline loss; %s.%s "
                    "(and its extra metrics) is not called",
                    type(module).__name__,
                    " / ".join(replaced),
                )

    def _build_loader(self, split: str, num_samples):
        from libai.fleetx.yaml_loaders import build_split_loader

        section = self.cfg.Data.get(split)
        if section is None:
            return None
        return build_split_loader(
            section,
            split,
            batch_size=self.local_batch_size,
            seed=self.cfg.Global.seed,
            consumed_samples=0,
            num_samples=num_samples,
            tokenizer=self.tokenizer,
        )

    def _train_samples(self):
        steps = self.cfg.Engine.max_steps
        return steps * self.global_batch_size if steps and steps > 0 else None

    def _eval_samples(self, iters):
        if not iters or iters <= 0:
            return None
        return iters * self.local_batch_size * self.util.layout.data_parallel_size

    def _epoch_steps(self, loader) -> int | None:
        if loader is None:
            return None
        try:
            size = len(loader.dataset)
        except (AttributeError, TypeError):
            return None
        steps = size // self.global_batch_size
        if steps < 1:
            raise ValueError(
                f"the training set has {size} samples, fewer than one global batch "
                f"(Global.global_batch_size={self.global_batch_size})"
            )
        return steps

    def _max_iter(self, steps_per_epoch, epochs) -> int:
        max_steps = self.cfg.Engine.max_steps
        by_epochs = steps_per_epoch * int(epochs) if steps_per_epoch and epochs else None
        candidates = [
            s for s in (max_steps if max_steps and max_steps > 0 else None, by_epochs) if s
        ]
        if not candidates:
            if self.mode != "train":
                return 1
            raise ValueError(
                "the run length is unknown: set Engine.max_steps, or Engine.num_train_epochs "
                "with a Data.Train section whose dataset has a length"
            )
        return min(candidates)

    def _build_optimizer(self, model):
        """The module's ``configure_optimizers()`` (an optimizer, or with its LR schedule),
        else the YAML's ``Optimizer`` section over ``model``."""
        from libai.fleetx.yaml_optim import build_yaml_optimizer

        configured = self.module.configure_optimizers()
        optimizer, scheduler = (
            configured if isinstance(configured, (tuple, list)) else (configured, None)
        )
        if optimizer is None:
            optimizer = build_yaml_optimizer(
                self.cfg.Optimizer, model, self.util.layout.device_type
            )
        return optimizer, scheduler

    def _build_lr_scheduler(self, optimizer):
        """The YAML's ``Optimizer.lr`` schedule over ``optimizer`` (the wrapped one)."""
        from libai.fleetx.yaml_optim import build_yaml_lr_scheduler

        return build_yaml_lr_scheduler(
            self.cfg.Optimizer,
            optimizer,
            self.max_iter,
            samples_per_step=self.cfg.Global.global_batch_size,
        )

    def _need(self, mode: str, what: str) -> None:
        if self.mode != mode:
            raise RuntimeError(f"Engine.{what} needs mode={mode!r} (this Engine: {self.mode!r})")

    # ---- training -----------------------------------------------------------------------------
    def fit(self, epoch: int | None = None, train_data_loader=None, valid_data_loader=None):
        """Train for ``epoch`` epochs (default ``Engine.num_train_epochs``), at most
        ``Engine.max_steps`` steps in all, evaluating every ``eval_freq`` and saving every
        ``save_steps`` (``run_mode: epoch``: every ``eval_freq`` / ``save_epoch`` epochs),
        logging every ``logging_freq``; resumes from where :meth:`load` left off."""
        trainer = self.build_trainer(epoch, train_data_loader, valid_data_loader)
        if self.run.train(trainer, trainer.max_iter):
            self._plot()

    def build_trainer(
        self, epoch: int | None = None, train_data_loader=None, valid_data_loader=None
    ) -> EagerTrainer:
        """The training loop :meth:`fit` runs, with its hooks registered and ``max_iter``
        set, positioned at the resume point (drive it yourself, e.g. to time steps)."""
        self._need("train", "fit")
        loader = train_data_loader if train_data_loader is not None else self.train_loader
        if loader is None:
            raise ValueError("Engine.fit needs a train_data_loader or a Data.Train section")
        valid = valid_data_loader if valid_data_loader is not None else self.valid_loader
        steps_per_epoch = self._epoch_steps(loader) if loader is not self.train_loader else None
        steps_per_epoch = steps_per_epoch or self.steps_per_epoch
        epochs = self.cfg.Engine.num_train_epochs if epoch is None else int(epoch)
        max_iter = self._max_iter(steps_per_epoch, epochs)
        evaluate = None
        if valid is not None:

            def evaluate():
                epoch_now = self.trainer.iter // (steps_per_epoch or 1)
                return {f"eval_{k}": v for k, v in self.evaluate(epoch_now, valid).items()}

        callbacks = ModuleCallbacks(
            self.module, self.cfg.Engine.logging_freq, steps_per_epoch, epochs, max_iter
        )
        self.trainer = self.run.loop(
            loader,
            max_iter=max_iter,
            evaluate=evaluate,
            batch_transform=self.module.pretreating_batch,
            extra_hooks=[callbacks, *filter(None, [profiler_hook(self.cfg)])],
        )
        return self.trainer

    def _plot(self) -> None:
        metrics = os.path.join(self.cfg.Engine.save_load.output_dir, "metrics.json")
        if dist.is_main_process() and os.path.exists(metrics):
            png = plot_loss_curve(metrics, metrics.replace("metrics.json", "loss_curve.png"))
            logger.info("Loss curve written to %s", png)

    # ---- evaluation and test ------------------------------------------------------------------
    def evaluate(self, epoch: int = 0, valid_data_loader=None) -> dict:
        """Loss (and the module's extra metrics) over ``Engine.eval_iters`` batches of the
        evaluation set (all of it when 0): ``validation_step`` per batch,
        ``validation_step_end`` every ``logging_freq``, then ``validation_epoch_end``."""
        loader = valid_data_loader if valid_data_loader is not None else self.valid_loader
        if loader is None:
            raise ValueError("Engine.evaluate needs a valid_data_loader or a Data.Eval section")
        results = self._loss_loop(
            loader,
            epoch,
            self.cfg.Engine.eval_iters,
            "validation_step",
            "validation_step_end",
            "eval_cost",
        )
        extra = self.module.validation_epoch_end(dict(results, epoch=epoch))
        out = {"loss": results["loss"], **(extra or {})}
        logger.info("Evaluation (%.1fs): %s", results["eval_cost"], out)
        return out

    def predict(self, epoch: int = 0, test_data_loader=None) -> dict:
        """FleetX's test pass: loss over ``Engine.test_iters`` batches of the test set (all of
        it when 0), ``test_step`` per batch and ``test_step_end`` every ``logging_freq``."""
        loader = test_data_loader if test_data_loader is not None else self.test_loader
        if loader is None:
            raise ValueError("Engine.predict needs a test_data_loader or a Data.Test section")
        results = self._loss_loop(
            loader, epoch, self.cfg.Engine.test_iters, "test_step", "test_step_end", "test_cost"
        )
        logger.info("Test (%.1fs): loss %.6g", results["test_cost"], results["loss"])
        return {"loss": results["loss"]}

    def _loss_loop(self, loader, epoch, max_batches, step_name, end_name, cost_key) -> dict:
        """The runtime's evaluation loop with the module's ``step_name`` (not under pp:
        there the pipeline schedule scores) and ``end_name`` every ``logging_freq``."""
        start = time.perf_counter()
        max_batches = max(int(max_batches or 0), 0)  # FleetX's -1: all of it, as 0
        total_batch = _length(loader, max_batches)
        freq = self.cfg.Engine.logging_freq
        window = []

        def log_window(index, batch, loss, logits):
            window.append(float(loss))
            if (index + 1) % freq == 0:
                getattr(self.module, end_name)(
                    {
                        "loss": sum(window) / len(window),
                        "epoch": epoch,
                        "batch": index,
                        "total_batch": total_batch,
                        cost_key: (time.perf_counter() - start) / (index + 1),
                    }
                )
                window.clear()

        run = run_evaluation(
            self.runner,
            loader,
            max_batches=max_batches,
            prepare=self.module.pretreating_batch,
            step=getattr(self.module, step_name),
            on_batch=log_window,
        )
        return {
            "loss": run.loss,
            "total_batch": run.batches,
            "sums": run.sums,
            cost_key: run.seconds,
        }

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, name: str | None = None) -> str:
        """Save a sharded checkpoint ``output_dir/name`` (default ``model_{step:07d}``) with
        the step, consumed samples, optimizer, LR schedule, loss scaler and RNG states."""
        iteration = self.start_iter - 1
        name = name or f"model_{max(iteration, 0):07d}"
        self.checkpointer.save(
            name, iteration=iteration, consumed_train_samples=self.consumed_train_samples
        )
        return os.path.join(self.checkpointer.save_dir, name)

    def load(self, path: str | None = None, resume: bool = True):
        """Load ``path`` (default ``Engine.save_load.ckpt_dir``): a checkpoint, or a directory
        whose ``last_checkpoint`` names one. With ``resume`` (train mode) also the optimizer,
        LR schedule, loss scaler, RNG and data position, so :meth:`fit` continues exactly
        where the saved run was; otherwise the weights only. Checkpoints reshard: any
        layout loads any other's. Returns the :class:`~libai.runtime.resume.ResumePoint`
        (``None`` for weights only)."""
        path = path or self.cfg.Engine.save_load.ckpt_dir
        if not path:
            raise ValueError("Engine.load needs a path or Engine.save_load.ckpt_dir")
        return self.run.load(path, resume=resume)

    # ---- export and inference -----------------------------------------------------------------
    def export(self, output_dir: str | None = None) -> list:
        """Export the model to ONNX under ``output_dir`` (default :meth:`export_dir`) and
        verify it with onnxruntime; returns the checks."""
        from libai.fleetx.export import export_module

        self._need("export", "export")
        output_dir = output_dir or self.export_dir()
        return export_module(self.module, self.runner.model, output_dir)

    def export_dir(self) -> str:
        """FleetX's layout: ``rank_0/`` under ``Inference.model_dir``, else under
        ``Engine.save_load.output_dir`` (where FleetX's inference YAML reads it back with
        ``Inference.model_dir: ./output``)."""
        base = self.cfg.Inference.model_dir or self.cfg.Engine.save_load.output_dir
        return os.path.join(base, "rank_0")

    def inference(self, data):
        """Outputs for ``data`` (a batch): with ``Inference.model_dir`` set, the exported ONNX
        graph in onnxruntime, post-processed by ``inference_end``; else the eager model,
        ``predict_step`` then ``predict_step_end``."""
        self._need("inference", "inference")
        if self.cfg.Inference.model_dir:
            if getattr(self, "_predictor", None) is None:
                self._predictor = self.module.onnx_predictor(self.cfg.Inference.model_dir)
            return self.module.inference_end(self._predictor(data))
        model = self.runner.model
        model.eval()
        batch = self.module.pretreating_batch(to_device(data, self.util.device))
        with torch.no_grad(), self.runner.autocast():
            outputs = self.module.predict_step(batch)
        return self.module.predict_step_end(outputs)


def _length(loader, max_batches) -> int | None:
    try:
        n = len(loader)
    except TypeError:
        return max_batches or None
    return min(n, max_batches) if max_batches else n
