"""``default_setup`` and ``DefaultTrainer``: a LiBai config in, a trained model out.

``DefaultTrainer`` builds everything from the config through ``build_*`` classmethods that a
project may override (detectron2's shape), then runs the eager loop with hooks.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections.abc import Mapping

from omegaconf import ListConfig

from libai import dist
from libai.config import (
    LazyConfig,
    instantiate,
    locate,
    resolve_batch_sizes,
    resolve_train_iters,
    try_get_key,
)
from libai.config.instantiate import is_lazy_node
from libai.oneflow_api import imports as oneflow_imports
from libai.optim import build_optimizer
from libai.runtime.blocks import compile_mode
from libai.runtime.core import resolve_compile, seed_all
from libai.runtime.evaluate import evaluate as run_evaluation
from libai.runtime.run import Run
from libai.runtime.run_config import build_run_tokenizer, fill_pipeline_num_layers
from libai.runtime.setup import setup_run
from libai.runtime.spec import RunSpec
from libai.runtime.trainer import TrainerBase
from libai.scheduler import build_lr_scheduler

logger = logging.getLogger(__name__)


def default_setup(cfg, args) -> None:
    """Mesh, output dir, logger, the full ``config.yaml``, and seeds.

    Everything that can be checked without a collective (layout, batch arithmetic) is
    checked before the process group is created, so bad input fails on every rank alike.
    """
    added = RunSpec.fill_defaults(cfg.train)  # LiBai's train.py leaves some keys out
    if added:
        logger.debug("train keys set to their defaults: %s", ", ".join(added))
    if args.fast_dev_run:
        cfg.train.train_iter = min(cfg.train.train_iter or 20, 20)
        cfg.train.train_epoch = 0
        cfg.train.log_period = 1
        cfg.train.checkpointer.period = 10
        cfg.train.evaluation.eval_period = 10
        cfg.train.evaluation.eval_iter = min(cfg.train.evaluation.eval_iter, 5)
    if args.resume:
        cfg.train.resume = True
    fill_pipeline_num_layers(cfg)
    world = int(os.environ.get("WORLD_SIZE", 1))
    derived = derive_data_parallel_size(cfg.train.dist, world)
    layout = dist.resolve_layout(cfg.train.dist, world)  # raises before any collective
    RunSpec.from_config(cfg.train).zero_stage(layout)  # so do types and ZeRO
    cfg.train.update(resolve_batch_sizes(cfg.train, layout.data_parallel_size)._asdict())
    setup_run(
        cfg.train.dist,
        cfg.train.output_dir,
        seed=cfg.train.seed,
        save_config=lambda: _save_config(cfg),
    )
    if derived:
        logger.warning(derived)


def derive_data_parallel_size(dist_cfg, world_size: int) -> str | None:
    """LiBai derives dp from the launch: ``world / (tp x pp)``. A configured
    ``data_parallel_size`` that disagrees is replaced; returns the warning that names both
    values (None when nothing changed; sizes that do not divide the world are left for the
    layout check to report)."""
    tp = dist_cfg.get("tensor_parallel_size") or 1
    pp = dist_cfg.get("pipeline_parallel_size") or 1
    asked = dist_cfg.get("data_parallel_size")
    if asked is None or world_size % (tp * pp) or asked == world_size // (tp * pp):
        return None
    derived = world_size // (tp * pp)
    dist_cfg.data_parallel_size = derived
    return (
        f"train.dist.data_parallel_size={asked} but the launch gives {world_size} processes / "
        f"(tp {tp} x pp {pp}) = {derived} data-parallel ranks; using {derived}, as LiBai does"
    )


def scale_epoch_periods(spec: RunSpec, samples_per_epoch: int | None, train=None) -> None:
    """LiBai's ``checkpointer.save_model_after_n_epoch`` and
    ``evaluation.eval_after_n_epoch``: the period becomes n x the iterations of an epoch
    (``len(dataset) // global_batch_size``, as LiBai counts), in ``spec`` and in LiBai's
    ``train`` namespace when given (the two never drift)."""
    asked = [
        (spec.checkpointer, "period", "checkpointer.save_model_after_n_epoch"),
        (spec.evaluation, "eval_period", "evaluation.eval_after_n_epoch"),
    ]
    for section, period, key in asked:
        epochs = getattr(section, key.partition(".")[2])
        if not epochs:
            continue
        if not samples_per_epoch:
            raise ValueError(
                f"train.{key}={epochs} needs the training set's length; this loader has none: "
                f"set train.{key}=None and give the period in iterations"
            )
        per_epoch = max(samples_per_epoch // spec.global_batch_size, 1)
        setattr(section, period, per_epoch * int(epochs))
        if train is not None:
            train[key.partition(".")[0]][period] = per_epoch * int(epochs)
        logger.info("train.%s=%s: every %d iterations", key, epochs, getattr(section, period))


def _save_config(cfg) -> None:
    """Rank 0 writes ``cfg`` to ``<train.output_dir>/config.yaml``."""
    output_dir = cfg.train.output_dir
    if dist.get_rank() == 0 and output_dir:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, "config.yaml")
        LazyConfig.save(cfg, path)
        logger.info("Full config saved to %s", path)


def with_tokenizer(loader_cfg, tokenizer):
    """``loader_cfg`` whose dataset nodes take ``tokenizer`` where they leave theirs unset,
    as LiBai's trainer hands the run's tokenizer to its datasets (on a copy: the saved config
    keeps no object). Nodes whose target takes no ``tokenizer`` are left alone."""
    datasets = try_get_key(loader_cfg, "dataset")
    if tokenizer is None or datasets is None:
        return loader_cfg
    many = isinstance(datasets, (list, ListConfig))
    wanting = [
        i for i, node in enumerate(datasets if many else [datasets]) if _wants_tokenizer(node)
    ]
    if not wanting:
        return loader_cfg
    loader_cfg = copy.deepcopy(loader_cfg)
    nodes = loader_cfg.dataset if many else [loader_cfg.dataset]
    for i in wanting:
        nodes[i].tokenizer = tokenizer
    return loader_cfg


def _wants_tokenizer(node) -> bool:
    """A LazyCall dataset node whose target takes ``tokenizer`` and which sets none."""
    if not is_lazy_node(node) or node.get("tokenizer") is not None:
        return False
    target = node["_target_"]
    target = locate(target) if isinstance(target, str) else target
    try:
        return "tokenizer" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def _warn_project_code_sees_local_batches(util) -> None:
    """LiBai project code (OneFlow's API, :mod:`libai.oneflow_api`) under data parallel: say
    once that it sees this rank's share of the batch, where OneFlow's global tensors hold the
    whole batch (its cross entropy is made global; other reductions across samples are not)."""
    if oneflow_imports.served and util.grad_size > 1:
        logger.warning(
            "LiBai project code runs on each rank's share of the batch (%d ranks share it): "
            "its cross entropy is the global batch's mean as in OneFlow, but code that mixes "
            "samples of the batch (in-batch negatives, batch statistics) sees this rank's "
            "samples only (docs/libai_configs.md, 'Global tensors')",
            util.grad_size,
        )


class DefaultTrainer(TrainerBase):
    """Builds data, model, optimizer, LR schedule, checkpointer and hooks from ``cfg``.

    As in LiBai, the trainer is the hook loop (hooks see it as ``hook.trainer``) and holds the
    runtime's step, an :class:`~libai.runtime.trainer.EagerTrainer` (``self._trainer``),
    rather than inheriting it: ``run_step`` is the held loop's step, and the model, runner,
    optimizer, LR schedule and data position are the held loop's.

    Override ``build_model`` / ``build_optimizer`` / ``build_lr_scheduler`` /
    ``build_train_loader`` / ``build_test_loader`` / ``build_evaluator`` in a project.
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        util = dist.get_dist_util()
        train = cfg.train
        _warn_project_code_sees_local_batches(util)
        self.tokenizer = self.build_tokenizer(cfg)
        self.train_loader, self.valid_loader, self.test_loader = self.build_train_loader(
            cfg, self.tokenizer
        )
        # LiBai evaluates on cfg.dataloader.test too; used here when the train builder gives
        # no valid loader (LiBai's vision configs: build_image_train_loader has none)
        self.extra_test_loaders = (
            self.build_test_loader(cfg, self.tokenizer) if self.valid_loader is None else []
        )
        samples_per_epoch = self._train_samples_per_epoch()
        iters = resolve_train_iters(train, samples_per_epoch, train.global_batch_size)
        train.train_iter, train.warmup_iter = iters.train_iter, iters.warmup_iter
        self.spec = RunSpec.from_config(train)  # the runtime's settings of this run
        scale_epoch_periods(self.spec, samples_per_epoch, train)
        # config.yaml now holds the run as resolved: the vocab the tokenizer sized (the model
        # actually built, which tools/convert_checkpoint.py and --eval-only read back), the
        # iterations and periods counted from epochs
        _save_config(cfg)
        seed_all(train.seed)  # identical weights on every rank and layout
        model = self.build_model(cfg)
        compiled = compile_mode(
            resolve_compile(try_get_key(cfg, "graph.enabled"), util.layout.device_type),
            try_get_key(cfg, "graph.compile_scope"),
            pipeline=util.layout.pipeline_parallel_size > 1,
            zero_stage=self.spec.zero_stage(util.layout),
        )
        if compiled:
            logger.info(
                "graph.enabled=True: LiBai's static graph is torch.compile of %s here; the "
                "first iterations pay the compile time (tens of seconds on %s); "
                "graph.enabled=False runs eager from the first step",
                "the whole model (graph.compile_scope='model')"
                if compiled == "model"
                else "each Transformer block",
                util.layout.device_type.upper(),
            )
        self.run = Run(
            model,
            self.spec,
            optimizer_fn=lambda parallel_model: self.build_optimizer(cfg, parallel_model),
            lr_scheduler_fn=lambda optimizer: self.build_lr_scheduler(cfg, optimizer),
            compile=compiled,
        )
        self.grad_scaler = self.run.grad_scaler
        self.checkpointer = self.run.checkpointer
        self._trainer = self.run.step(self.train_loader)
        self.start_iter, self.max_iter = 0, train.train_iter
        self.register_hooks(self.build_hooks())

    # ---- the held loop ------------------------------------------------------------------------
    def run_step(self):
        """One step of the held :class:`EagerTrainer` at this loop's iteration."""
        self._trainer.iter, self._trainer.max_iter = self.iter, self.max_iter
        self._trainer.storage = self.storage
        self._trainer.run_step()

    runner = property(lambda self: self._trainer.runner)
    model = property(lambda self: self._trainer.model)
    optimizer = property(lambda self: self._trainer.optimizer)
    lr_scheduler = property(lambda self: self._trainer.lr_scheduler)
    data_loader = property(lambda self: self._trainer.data_loader)
    global_batch_size = property(lambda self: self._trainer.global_batch_size)
    last_batch_tokens = property(lambda self: self._trainer.last_batch_tokens)
    last_loss = property(lambda self: self._trainer.last_loss)

    @property
    def consumed_train_samples(self) -> int:
        return self._trainer.consumed_train_samples

    @consumed_train_samples.setter
    def consumed_train_samples(self, value: int) -> None:
        self._trainer.consumed_train_samples = int(value)

    def set_data_loader(self, data_loader) -> None:
        self._trainer.set_data_loader(data_loader)

    def checkpoint_extra(self) -> dict:
        """The step and data position a checkpoint saved now resumes from."""
        self._trainer.iter, self._trainer.max_iter = self.iter, self.max_iter
        return self._trainer.checkpoint_extra()

    # ---- builders -----------------------------------------------------------------------------
    @classmethod
    def build_tokenizer(cls, cfg):
        """The tokenizer (None without ``tokenization``), the vocab padded as
        :func:`~libai.runtime.run_config.build_run_tokenizer` pads it."""
        return build_run_tokenizer(cfg)

    @classmethod
    def build_model(cls, cfg):
        model = instantiate(cfg.model)  # parameters are created on the mesh device
        logger.info("Model:\n%s", model)
        return model

    @classmethod
    def build_optimizer(cls, cfg, model):
        return build_optimizer(cfg.optim, model)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer):
        return build_lr_scheduler(
            cfg.train.scheduler, optimizer, cfg.train.train_iter, cfg.train.warmup_iter
        )

    @classmethod
    def build_train_loader(cls, cfg, tokenizer=None):
        """``(train, valid, test)`` loaders of ``cfg.dataloader.train``; this rank's share."""
        train = cfg.train
        per_rank_batch = train.train_micro_batch_size * train.num_accumulation_steps
        dp = dist.get_data_parallel_size()
        test_batch = train.test_micro_batch_size
        if dist.get_pipeline_parallel_size() > 1 and test_batch != per_rank_batch:
            # the pipeline stages' buffers are sized by the training batch
            logger.info(
                "pipeline parallel: evaluating in batches of %d (the training batch per rank)",
                per_rank_batch,
            )
            test_batch = per_rank_batch
        eval_samples = train.evaluation.eval_iter * test_batch * dp
        train_samples = train.train_samples or train.train_iter * train.global_batch_size
        return instantiate(
            with_tokenizer(cfg.dataloader.train, tokenizer),
            train_batch_size=per_rank_batch,
            test_batch_size=test_batch,
            train_val_test_num_samples=[train_samples, eval_samples, eval_samples],
            consumed_samples=train.consumed_train_samples or 0,
            seed=train.seed,
        )

    @classmethod
    def build_test_loader(cls, cfg, tokenizer=None) -> list:
        """The loaders of ``cfg.dataloader.test`` (a list of lazy loader configs; none when
        absent), each with ``train.test_micro_batch_size`` and ``train.seed`` as LiBai's,
        their datasets that take a tokenizer given ``tokenizer`` (:func:`with_tokenizer`)."""
        tests = try_get_key(cfg, "dataloader.test")
        if tests is None:
            return []
        tests = [tests] if is_lazy_node(tests) else list(tests)
        return [
            instantiate(
                with_tokenizer(t, tokenizer),
                test_batch_size=cfg.train.test_micro_batch_size,
                seed=cfg.train.seed,
            )
            for t in tests
        ]

    @classmethod
    def build_evaluator(cls, cfg):
        return instantiate(cfg.train.evaluation.evaluator)

    def _train_samples_per_epoch(self) -> int | None:
        try:
            return len(self.train_loader.dataset)
        except (AttributeError, TypeError):
            return None

    # ---- hooks, evaluation, resume --------------------------------------------------------------
    def build_hooks(self):
        seq_len = try_get_key(self.cfg, "model.cfg.max_seq_length")
        tokens_per_iter = self.global_batch_size * seq_len if seq_len else None
        loaders = self.valid_loader is not None or self.extra_test_loaders
        evaluate = self.evaluate if loaders else None
        return self.run.hooks(
            max_iter=self.max_iter, evaluate=evaluate, tokens_per_iter=tokens_per_iter
        )

    def evaluate(self, loader=None) -> dict:
        """The runtime's evaluation loop (:func:`libai.runtime.evaluate.evaluate`) feeding
        the config's evaluator: each batch gives it ``{"lm_loss": mean loss}`` (perplexity);
        an evaluator with ``needs_predictions`` (accuracy) gets ``{"lm_loss", "logits"}``
        from one forward, on the last pipeline stage only (the evaluators sum their counts
        over stages)."""
        if loader is None and self.valid_loader is None and self.extra_test_loaders:
            # LiBai's test(): every cfg.dataloader.test loader, keys prefixed when several
            if len(self.extra_test_loaders) == 1:
                return self.evaluate(self.extra_test_loaders[0])
            return {
                f"test{i}/{key}": value
                for i, test_loader in enumerate(self.extra_test_loaders)
                for key, value in self.evaluate(test_loader).items()
            }
        loader = loader if loader is not None else self.valid_loader
        evaluator = self.build_evaluator(self.cfg)
        # a LiBai project model (no pipeline_forward) gives its evaluator its outputs, as
        # LiBai's trainer does; libai's models give logits to the evaluators that need them
        predictions = bool(getattr(evaluator, "needs_predictions", False)) or not hasattr(
            self.runner.model, "pipeline_forward"
        )
        evaluator.reset()

        def process(index, batch, loss, logits):
            if predictions and isinstance(logits, Mapping):  # a LiBai project model's outputs
                evaluator.process(batch, {"lm_loss": loss, **logits})
            elif predictions and logits is not None:
                evaluator.process(batch, {"lm_loss": loss, "logits": logits})
            elif not predictions:
                evaluator.process(batch, {"lm_loss": loss})

        run = run_evaluation(
            self.runner,
            loader,
            max_batches=self.cfg.train.evaluation.eval_iter,
            predictions=predictions,
            on_batch=process,
        )
        results = evaluator.evaluate()
        logger.info("Evaluation (%.1fs): %s", run.seconds, results)
        return results

    def resume_or_load(self, resume: bool = True) -> None:
        """Resume from ``output_dir``'s last checkpoint, or load ``train.load_weight``."""
        point = self.run.resume_or_load(self.cfg.train.load_weight, resume=resume)
        if point is not None:
            self.start_iter, self.consumed_train_samples = point
            self.cfg.train.consumed_train_samples = self.consumed_train_samples
            self.train_loader = self.build_train_loader(self.cfg, self.tokenizer)[0]
            self.set_data_loader(self.train_loader)

    def train(self) -> bool:
        """Train from ``start_iter`` to ``train.train_iter``; False (and a log line saying so)
        when a resumed run has nothing left to train."""
        self.run.start_iter = self.start_iter
        return self.run.train(self, self.max_iter)
