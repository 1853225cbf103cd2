"""``AccelerateEngine``: the mesh and the acceleration switches of the command line, for the
three ways in (the black box, the templates, and ``compose`` for a loop of your own).

Every way runs on the core (:mod:`libai.runtime.core`): the same ``ModelRunner`` (mixed
precision, loss scaler, ZeRO, recompute, compile, gradient sync), optimizer sharding,
checkpointer, hooks and writers as ``tools/train_net.py``; the black box and the templates
run the core's loop (:meth:`AccelerateEngine.fit`).

compose, for your own loop (a Hugging Face no-trainer script changed in a few lines)::

    engine = AccelerateEngine(argv)          # or an argparse.Namespace / dict of flag values
    model, optimizer, lr_scheduler = engine.compose(model, lr_scheduler_fn=...)
    for batch in engine.build_data_loader(train_dataset):
        loss = model(**batch).loss           # under autocast when --mixed-precision
        engine.backward(loss)                # scaled for fp16
        optimizer.step()                     # dp gradient sync, unscale / skip, clipping
        lr_scheduler.step()                  # not on a skipped fp16 step
        optimizer.zero_grad()
"""

from __future__ import annotations

import argparse
import logging
import math
import os

import torch
import torch.distributed as torch_dist
from torch import nn

from libai.accelerate.arguments import check_args, parse_args, train_namespace
from libai.accelerate.collate import PaddingCollator
from libai.accelerate.data import build_loader
from libai.accelerate.hf_load import is_hf_model_dir, load_hf_weights
from libai.optim import get_default_optimizer_params
from libai.runtime.run import Run
from libai.runtime.setup import setup_run
from libai.runtime.trainer import to_device
from libai.scheduler import WarmupCosineLR, WarmupLinearLR

logger = logging.getLogger(__name__)

__all__ = ["AccelerateEngine", "EpochLoader", "current_engine"]

#: the engine created last in this process (Megatron's global args: ``get_args()``)
_CURRENT: list = [None]

#: ``datasets`` split names that build_data_loader reads as evaluation data by default
EVAL_SPLITS = ("validation", "valid", "dev", "test", "eval", "evaluation")


def current_engine():
    """The :class:`AccelerateEngine` created last in this process (``None`` before)."""
    return _CURRENT[0]


def _is_eval_split(dataset) -> bool:
    split = getattr(dataset, "split", None)
    return split is not None and str(split).split("[")[0].lower() in EVAL_SPLITS


def _layer_count(path: str | None) -> int | None:
    """Layers of a Hugging Face ``config.json`` (encoder + decoder for T5), for pp stages."""
    if not path:
        return None
    import json

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    for key in ("num_hidden_layers", "n_layer"):
        if hf.get(key) is not None:
            return int(hf[key])
    if hf.get("num_layers") is not None:  # T5: the encoder's and the decoder's
        return int(hf["num_layers"]) + int(hf.get("num_decoder_layers") or hf["num_layers"])
    return None


class EpochLoader:
    """One epoch of an endless cyclic loader per ``iter()`` (``len`` batches), continuing
    where the previous epoch stopped: a loop of your own sees the black box's data order."""

    def __init__(self, loader, steps_per_epoch: int, device=None):
        self.loader, self.steps, self.device = loader, steps_per_epoch, device
        self.dataset = loader.dataset
        self._it = None

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        if self._it is None:
            self._it = iter(self.loader)
        for _ in range(self.steps):
            batch = next(self._it)
            yield batch if self.device is None else to_device(batch, self.device)


class _EvalLoader:
    """One pass of ``loader`` with the batches on ``device`` (other attributes: the loader's)."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield to_device(batch, self.device)

    def __getattr__(self, name):
        return getattr(self.__dict__["loader"], name)


class _ComposedModel(nn.Module):
    """The composed model: its forward runs under the run's autocast; attribute access
    falls through to the wrapped module (``config``, ``save_pretrained``, ...)."""

    def __init__(self, module: nn.Module, engine: AccelerateEngine):
        super().__init__()
        self.module = module
        self.__dict__["_engine"] = engine

    def forward(self, *args, **kwargs):
        with self._engine.runner.autocast():
            return self.module(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["module"], name)


class _ComposedOptimizer:
    """``step()`` = the runner's end of a step: dp gradient sync, fp16 unscale (a step that
    overflows on any rank is skipped everywhere), global-norm clipping, the inner step."""

    def __init__(self, optimizer, engine: AccelerateEngine):
        self.optimizer, self._engine = optimizer, engine

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closures are not supported: call engine.backward(loss) first")
        runner = self._engine.runner
        runner.sync_gradients()
        clip = self._engine.args.clip_grad
        runner.optimizer_step(self.optimizer, max_grad_norm=clip if clip > 0 else None)

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


class _ComposedScheduler:
    """The LR schedule; ``step()`` does nothing after an fp16 step that was skipped."""

    def __init__(self, scheduler, engine: AccelerateEngine):
        self.scheduler, self._engine = scheduler, engine

    def step(self, *args, **kwargs):
        if not self._engine.runner.last_step_skipped:
            self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.scheduler, name)


class AccelerateEngine:
    """The mesh of the flags, then :meth:`compose` / :meth:`fit` on the core.

    Args:
        args: an ``argparse.Namespace`` from :func:`~libai.accelerate.arguments.parse_args`,
            a dict of flag values (``{"micro_batch_size": 8, ...}``: defaults for the rest),
            a list of command-line words, or ``None`` (``sys.argv``).
    """

    def __init__(self, args=None):
        if isinstance(args, argparse.Namespace):
            self.args = args if hasattr(args, "data_parallel_size") else check_args(args)
        elif isinstance(args, dict):
            from libai.accelerate.arguments import build_parser

            namespace = build_parser().parse_args([])
            unknown = [k for k in args if not hasattr(namespace, k)]
            if unknown:
                raise ValueError(f"unknown flag(s) {unknown} (use the flags' names with '_')")
            vars(namespace).update(args)
            self.args = check_args(namespace)
        else:
            self.args = parse_args(args)
        a = self.args
        self.dist_cfg = {
            "data_parallel_size": a.data_parallel_size,
            "tensor_parallel_size": a.tensor_model_parallel_size,
            "pipeline_parallel_size": a.pipeline_model_parallel_size,
            "pipeline_num_layers": _layer_count(a.pretrained_model_name_or_path)
            if a.pipeline_model_parallel_size > 1
            else None,
            "device_type": a.device,
            "pipeline_schedule": a.pipeline_schedule,
            "expert_parallel_size": a.expert_model_parallel_size,
        }
        self.util = setup_run(self.dist_cfg, a.save, seed=a.seed)
        self.run = self.parts = self.runner = self.model = None
        #: the tokenizer build_data_loader pads with (default: --pretrained-model-name-or-path's,
        #: else the composed model directory's)
        self.tokenizer = None
        _CURRENT[0] = self

    # ---- pieces ---------------------------------------------------------------------------
    def train_namespace(self, train_iter: int):
        return train_namespace(self.args, train_iter=train_iter, dist_cfg=self.dist_cfg)

    def build_run(
        self,
        model: nn.Module,
        train_iter: int,
        *,
        optimizer=None,
        lr_scheduler=None,
        lr_scheduler_fn=None,
        loss_fn=None,
    ) -> Run:
        """The core's run of ``model`` with the switches of the flags: parallelized (ZeRO-3
        shards the model), ``optimizer`` (``None``: AdamW from the flags, built after the
        sharding) wrapped for ZeRO, the LR schedule (``lr_scheduler``, else
        ``lr_scheduler_fn(optimizer)``, else the flags'), checkpoints under ``--save``."""
        a = self.args
        self._refuse_prebuilt_optimizer(optimizer)
        self.train_cfg = self.train_namespace(train_iter)
        if lr_scheduler_fn is None:
            lr_scheduler_fn = (
                (lambda _: lr_scheduler)
                if lr_scheduler is not None
                else (lambda opt: self.build_lr_scheduler(opt, train_iter))
            )
        self.run = Run(
            model,
            self.train_cfg,
            optimizer_fn=lambda parallel: (
                optimizer if optimizer is not None else self.build_optimizer(parallel)
            ),
            lr_scheduler_fn=lr_scheduler_fn,
            compile=bool(a.graph_optimization),
            loss_fn=loss_fn,
            resume_hint=f"resume it with --load {a.save}",
            length_key="--train-iters",
        )
        self.parts, self.runner = self.run.parts, self.run.runner
        return self.run

    def _refuse_prebuilt_optimizer(self, optimizer) -> None:
        if optimizer is not None and self.args.zero_stage == 3:
            raise ValueError(
                "ZeRO-3 shards the parameters before the optimizer is built: return None for "
                "the optimizer (AdamW from the flags)"
            )

    def build_optimizer(self, model: nn.Module):
        """AdamW with the flags' weight decay (none on norms and biases) and clipping."""
        a = self.args
        params = get_default_optimizer_params(
            model,
            weight_decay_norm=0.0,
            weight_decay_bias=0.0,
            clip_grad_max_norm=a.clip_grad if a.clip_grad > 0 else None,
            clip_grad_norm_type=2.0 if a.clip_grad > 0 else None,
        )
        fused = {"fused": True} if a.device == "cuda" else {}
        return torch.optim.AdamW(
            params,
            lr=a.lr,
            weight_decay=a.weight_decay,
            betas=(a.adam_beta1, a.adam_beta2),
            eps=a.adam_eps,
            **fused,
        )

    def build_lr_scheduler(self, optimizer, train_iter: int):
        """``--lr-decay-style`` over ``--lr-decay-iters`` (default the run) after
        ``--lr-warmup-iters`` / ``--lr-warmup-fraction``, down to ``--min-lr``."""
        a = self.args
        decay = int(a.lr_decay_iters or train_iter)
        warmup = a.lr_warmup_iters
        if warmup is None:
            warmup = math.ceil((a.lr_warmup_fraction or 0.0) * decay)
        floor = a.min_lr / a.lr if a.lr else 0.0
        if a.lr_decay_style == "linear":
            return WarmupLinearLR(optimizer, decay, 0.0, warmup, end_factor=floor)
        alpha = 1.0 if a.lr_decay_style == "constant" else floor
        return WarmupCosineLR(optimizer, decay, 0.0, warmup, alpha=alpha)

    def build_data_loader(
        self,
        dataset,
        batch_size: int | None = None,
        *,
        train: bool | None = None,
        collate_fn=None,
        steps_per_epoch: int | None = None,
        tokenizer=None,
    ):
        """This rank's loader of ``dataset``, its batches on the run's device: for training
        one epoch per ``iter()`` (batches of ``--micro-batch-size`` x accumulation,
        reshuffled every epoch), for evaluation one sharded pass in order (over the first
        ``--eval-iters`` global batches when it is set). ``train=None``: evaluation for a
        ``datasets`` split named validation / test / dev, training otherwise.

        Without ``collate_fn``, token lists and ragged samples are padded by the tokenizer's
        ``DataCollatorWithPadding`` (``tokenizer``, else :attr:`tokenizer`, else
        ``--pretrained-model-name-or-path``'s, else the composed model directory's), or
        to the longest with zeros when none is known (:mod:`libai.accelerate.collate`)."""
        a = self.args
        if train is None:
            train = not _is_eval_split(dataset)
        if collate_fn is None:
            collate_fn = PaddingCollator(lambda: tokenizer or self.find_tokenizer())
        size = batch_size or a.micro_batch_size * a.num_accumulation_steps
        if not train and a.eval_iters:
            # --eval-iters counts global batches, as in Megatron: the first eval_iters x
            # global batch samples, sharded, so every data-parallel size scores the same set
            dp = self.util.layout.data_parallel_size
            count = min(len(dataset), a.eval_iters * size * dp)
            dataset = torch.utils.data.Subset(dataset, range(count))
        loader = build_loader(
            dataset,
            size,
            train=train,
            seed=a.seed,
            collate_fn=collate_fn,
            num_workers=a.num_workers,
        )
        if not train:
            return _EvalLoader(loader, self.util.device)
        steps = steps_per_epoch or len(dataset) // a.global_batch_size
        if steps < 1:
            raise ValueError(
                f"build_data_loader: {len(dataset)} samples are fewer than one global batch "
                f"(--global-batch-size {a.global_batch_size})"
            )
        return EpochLoader(loader, steps, self.util.device)

    def find_tokenizer(self):
        """:attr:`tokenizer`, else the tokenizer saved in ``--pretrained-model-name-or-path``
        or in the composed model's directory (``None`` when there is none)."""
        if self.tokenizer is not None:
            return self.tokenizer
        candidates = [self.args.pretrained_model_name_or_path]
        if self.model is not None:
            candidates.append(getattr(getattr(self.model, "config", None), "_name_or_path", None))
        for path in candidates:
            if path and os.path.isfile(os.path.join(path, "tokenizer_config.json")):
                from transformers import AutoTokenizer

                self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
                return self.tokenizer
        return None

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of every data-parallel rank, concatenated along dim 0 (rank order)."""
        group = self.util.dp_group
        if group is None:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.util.layout.data_parallel_size)]
        torch_dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    # ---- compose ----------------------------------------------------------------------------
    def compose(
        self,
        model: nn.Module | None = None,
        train_dataloader=None,
        eval_dataloader=None,
        optimizer=None,
        lr_scheduler_fn=None,
        train_iters: int | None = None,
        *,
        model_obj: nn.Module | None = None,
    ):
        """Put ``model`` (Rapidformer's keyword: ``model_obj``) on the run's switches;
        returns ``(model, optimizer, lr_scheduler)`` (plus the two loaders, rebuilt on this
        rank's share, when given).

        ``optimizer=None`` builds AdamW from the flags (required under ZeRO-3, which shards
        the parameters first); ``lr_scheduler_fn(optimizer)`` builds the schedule (default:
        the flags'). The model comes back in training mode and its forward runs under
        autocast; see the module doc for the loop."""
        a = self.args
        if (model is None) == (model_obj is None):
            raise TypeError("compose takes the model once: compose(model) or compose(model_obj=)")
        model = model if model is not None else model_obj
        if self.util.layout.pipeline_parallel_size > 1:
            raise ValueError("compose runs your own forward: no pipeline parallel (use fit)")
        if optimizer is not None and a.zero_stage == 3:
            raise ValueError(
                "ZeRO-3 shards the parameters in compose, so an optimizer built before would "
                "hold the old ones: pass optimizer=None (AdamW from the flags)"
            )
        steps = train_iters or a.train_iters
        if steps is None and train_dataloader is not None and a.epochs:
            steps = a.epochs * (len(train_dataloader.dataset) // a.global_batch_size)
        if not steps and lr_scheduler_fn is None:
            raise ValueError(
                "compose needs the run's length for the LR schedule: --train-iters, "
                "train_iters=, or a train_dataloader with --epochs (or pass lr_scheduler_fn)"
            )
        run = self.build_run(
            model, int(steps or 1), optimizer=optimizer, lr_scheduler_fn=lr_scheduler_fn
        )
        self.optimizer = _ComposedOptimizer(run.optimizer, self)
        self.lr_scheduler = _ComposedScheduler(run.lr_scheduler, self)
        self.runner.model.train()  # from_pretrained hands models over in eval mode
        self.model = _ComposedModel(self.runner.model, self)
        out = [self.model, self.optimizer, self.lr_scheduler]
        for loader, train in ((train_dataloader, True), (eval_dataloader, False)):
            if loader is not None:
                out.append(
                    self.build_data_loader(
                        loader.dataset,
                        train=train,
                        collate_fn=loader.collate_fn,
                        batch_size=None if train else loader.batch_size,
                    )
                )
        return tuple(out)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` as the runner does it (times the fp16 loss scale)."""
        self.runner.backward(loss)

    def step(self) -> None:
        """``optimizer.step()``, ``lr_scheduler.step()``, ``optimizer.zero_grad()``."""
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad()

    # ---- the core's loop --------------------------------------------------------------------
    def fit(
        self,
        model,
        optimizer,
        lr_scheduler,
        train_dataset,
        *,
        train_iter: int,
        loss_fn=None,
        evaluate=None,
        collate_fn=None,
        batch_transform=None,
    ):
        """Train ``model`` with the core's loop for ``train_iter`` steps: the runner of the
        flags (``loss_fn(batch)`` instead of the model contract when given), ``optimizer``
        / ``lr_scheduler`` (``None``: from the flags; an optimizer is refused under ZeRO-3),
        checkpoints every ``--save-interval`` under ``--save`` (``--load``: a checkpoint
        resumes; a Hugging Face model directory gives the starting weights, at step 0),
        ``evaluate()`` every ``--eval-interval`` and at the end, console / metrics.json /
        TensorBoard every ``--log-interval``. Returns the trained (runner) model."""
        a = self.args
        self._refuse_prebuilt_optimizer(optimizer)
        hf_weights = bool(a.load) and is_hf_model_dir(a.load)
        if hf_weights:  # weights to start from, before the switches shard the model
            load_hf_weights(model, a.load)
        run = self.build_run(
            model, train_iter, optimizer=optimizer, lr_scheduler=lr_scheduler, loss_fn=loss_fn
        )
        if a.load and not hf_weights:
            logger.info("--load %s: a checkpoint: resuming the run it saved", a.load)
            run.load(a.load)
        loader = build_loader(
            train_dataset,
            a.micro_batch_size * a.num_accumulation_steps,
            train=True,
            seed=a.seed,
            collate_fn=collate_fn,
            num_workers=a.num_workers,
        )
        self.trainer = run.loop(
            loader, max_iter=train_iter, evaluate=evaluate, batch_transform=batch_transform
        )
        run.train(self.trainer, train_iter)
        return self.runner.model

    def eval_batches(self, loader, max_batches: int = 0):
        """Batches of ``loader`` on this rank's device (at most ``max_batches``; 0: all)."""
        for i, batch in enumerate(loader):
            if max_batches and i >= max_batches:
                return
            yield to_device(batch, self.util.device)
