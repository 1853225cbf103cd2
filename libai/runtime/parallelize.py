"""The one place a model is parallelized for a run, in a fixed order (torchtitan's). Each
transform lives in its own module:

0. tensor and sequence parallel: at construction -- libai's layers are built on the mesh as
   DTensors (``libai.layers``), so a model is tp-sharded when it exists;
1. float8 matmuls (``train.amp.fp8``; :mod:`libai.layers.float8`), before anything copies or
   traces the layers; then LoRA adapters (``train.lora``; :mod:`libai.models.lora`), the
   rest of the model frozen;
2. the pipeline split (:mod:`libai.runtime.pipeline_split`, the schedule in
   :mod:`libai.runtime.pipeline_schedule`): the model pruned to this rank's stages, a copy
   per virtual stage;
3. activation checkpointing, then ``torch.compile``, on the blocks of what this rank runs
   (:mod:`libai.runtime.blocks`);
4. the gradient reductions (:mod:`libai.runtime.grad_sync`): tied weights, dp (x cp),
   sequence-parallel sums; context parallel shards each batch as it arrives
   (:mod:`libai.runtime.context_parallel`);
5. mixed precision O2: parameters cast, fp32 masters kept (:mod:`libai.runtime.master_weights`);
6. ZeRO-3: FSDP2 ``fully_shard`` per block and the root, HSDP with a replicate size
   (:mod:`libai.runtime.fsdp`);
7. once the optimizer exists (:func:`shard_optimizer_for`): ZeRO-1/2 shard its state and the
   gradients over the data-parallel ranks (:mod:`libai.runtime.zero`); O2 swaps the fp32
   masters in for the parameters this rank steps.

Steps 2-4 run inside :class:`~libai.runtime.parallel.ModelRunner`'s constructor (so a runner
built directly is parallelized the same way); the runner itself only steps. Every door calls
:func:`parallelize` (through :mod:`libai.runtime.core`); nothing else applies a parallel
feature.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from libai import dist
from libai.layers.float8 import check_fp8_layout, enable_float8_training, hardware_has_fp8
from libai.models.lora import apply_lora
from libai.runtime.amp import DynamicLossScaler
from libai.runtime.master_weights import MasterWeights
from libai.runtime.parallel import ModelRunner
from libai.runtime.spec import RunSpec
from libai.runtime.zero import prepare_model, shard_optimizer

logger = logging.getLogger(__name__)

__all__ = ["RunnerParts", "as_spec", "build_runner", "parallelize", "shard_optimizer_for"]

#: fp16's initial loss scale when ``train.amp.init_scale`` is not set
DEFAULT_INIT_SCALE = 2.0**16


def as_spec(train) -> RunSpec:
    """``train`` as a :class:`RunSpec` (a LiBai ``train`` namespace is read and checked)."""
    return train if isinstance(train, RunSpec) else RunSpec.from_config(train)


class RunnerParts(NamedTuple):
    """What :func:`parallelize` built: the runner, fp16's loss scaler, the ZeRO stage."""

    runner: ModelRunner
    grad_scaler: DynamicLossScaler | None
    zero_stage: int | None


def parallelize(
    model: torch.nn.Module,
    train: RunSpec,
    *,
    compile: bool | str = False,
    loss_fn=None,
    backward_fn=None,
    autocast_op_lists=None,
) -> RunnerParts:
    """``model`` parallelized and wrapped for training with the switches of the run spec
    ``train``, in the order of the module doc: the pipeline split, activation checkpointing
    and compile inside :class:`ModelRunner` (``dist.pipeline_schedule``,
    ``num_accumulation_steps``, ``activation_checkpoint``), then FSDP2 / HSDP for ZeRO-3
    (before the optimizer exists); ``amp`` gives the autocast dtype and fp16's loss scaler.

    ``loss_fn`` / ``backward_fn`` / ``autocast_op_lists`` go to the runner (a task module's
    ``training_step`` and ``backward``, custom autocast op lists). Raises before any
    collective for a ZeRO stage or switch the layout cannot apply.
    """
    spec = as_spec(train)
    util = dist.mesh_of(model)  # the mesh the model was built on
    amp_dtype = spec.amp_dtype()
    grad_scaler = None
    if amp_dtype == torch.float16:
        grad_scaler = DynamicLossScaler(init_scale=float(spec.amp.init_scale or DEFAULT_INIT_SCALE))
    zero = spec.zero_optimization
    if spec.amp.master_weights() and zero.enabled and zero.stage == 3:
        raise ValueError(
            "mixed precision level O2 (fp32 master weights) with ZeRO stage 3 is not "
            "supported: use ZeRO stage 1 or 2 with O2, or level O1 (autocast) with stage 3"
        )
    zero_stage = spec.zero_stage(util.layout)  # may raise
    _enable_fp8(model, spec, util)  # may raise
    _apply_lora(model, spec)  # may raise
    runner = ModelRunner(
        model,
        num_microbatches=spec.num_accumulation_steps,
        schedule=spec.dist.pipeline_schedule,
        amp_dtype=amp_dtype,
        loss_scaler=grad_scaler,
        activation_checkpointing=spec.checkpointing() or False,
        no_recompute_layers=tuple(spec.activation_checkpoint.no_recompute_layers or ()),
        compile=compile if compile == "model" else bool(compile),
        loss_fn=loss_fn,
        backward_fn=backward_fn,
        autocast_op_lists=autocast_op_lists,
    )
    if spec.amp.master_weights():
        runner.master_weights = MasterWeights(runner.model, amp_dtype)
        runner.master_weights.cast_model()
    # ZeRO stage 3: fully_shard (before the optimizer), HSDP when hsdp_replicate_size > 1
    prepare_model(
        runner, zero_stage, hsdp_replicate_size=spec.zero_optimization.hsdp_replicate_size
    )
    return RunnerParts(runner, grad_scaler, zero_stage)


def _apply_lora(model: torch.nn.Module, spec: RunSpec) -> None:
    """``train.lora``: adapters on the named layers, the rest frozen (before the pipeline
    split, so every stage's layers get theirs)."""
    config = spec.lora.config()
    if config is None:
        return
    adapted = apply_lora(model, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(
        "LoRA r=%d alpha=%g on %d layers (%s, ...): %d of %d parameters trainable (%.2f%%)",
        config.r,
        config.lora_alpha,
        len(adapted),
        adapted[0],
        trainable,
        total,
        100 * trainable / max(total, 1),
    )


def _enable_fp8(model: torch.nn.Module, spec: RunSpec, util) -> None:
    """``train.amp.fp8``: the large Linear layers' matmuls in float8 (before the pipeline
    split copies stages and before compile traces them); emulated where this rank's device
    has no float8 matmul."""
    recipe = spec.amp.fp8_recipe()
    if recipe is None:
        return
    check_fp8_layout(util.layout)
    emulate = not hardware_has_fp8(util.device)
    # the output head stays in high precision (torchtitan's default): lm_head is a Hugging
    # Face model's; libai's models compute logits in LMLogits, not a Linear
    names = enable_float8_training(
        model, recipe, emulate=emulate, min_size=spec.amp.fp8_min_size, skip=("lm_head",)
    )
    if names:
        logger.info(
            "fp8 (%s%s): %d Linear layers, e.g. %s",
            recipe,
            ", emulated: no float8 matmul on this device" if emulate else "",
            len(names),
            names[0],
        )
    else:
        logger.warning(
            "train.amp.fp8=%r: no Linear layer is large enough to gain from float8 "
            "(set train.amp.fp8_min_size=False to convert every layer whose dims divide by 16)",
            recipe,
        )


def shard_optimizer_for(parts: RunnerParts, optimizer: torch.optim.Optimizer):
    """``optimizer`` wrapped for the runner's ZeRO stage (itself without ZeRO); under mixed
    precision O2 the low-precision parameters it steps (under ZeRO-1: those this rank owns)
    are swapped for fp32 masters."""
    master_weights = parts.runner.master_weights
    if parts.zero_stage is None:
        return optimizer if master_weights is None else master_weights.attach(optimizer)
    sharded = shard_optimizer(parts.runner, optimizer, parts.zero_stage)
    if master_weights is not None:  # stages 1/2: masters for this rank's own parameters only
        master_weights.attach(sharded.inner, zero=sharded)
    logger.info(
        "ZeRO stage %d over %d dp ranks",
        parts.zero_stage,
        parts.runner.util.layout.data_parallel_size,
    )
    return sharded


#: the name the doors used before :func:`parallelize` (kept for projects)
build_runner = parallelize
