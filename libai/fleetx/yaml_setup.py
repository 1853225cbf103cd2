"""The FleetX front door's translation into the core: a YAML config becomes the mesh, the
task module, and LiBai's ``train`` namespace that :mod:`libai.runtime.core` builds from.

::

    cfg = load_yaml_config("projects/gpt/pretrain_gpt_345M_single_card.yaml", ["Engine.max_steps=10"])
    setup_yaml_run(cfg)                    # checks, mesh, output dir, logger, config.yaml, seed
    module = build_module(cfg)             # Model.module(cfg)
    engine = Engine(cfg, module)           # libai.engine.Engine
"""

from __future__ import annotations

import logging
import os
import sys

import torch
from omegaconf import DictConfig, OmegaConf

from libai import dist
from libai.fleetx.fleetx_keys import announce_no_effect_keys, check_unsupported
from libai.fleetx.yaml_config import YAMLConfigError, resolve_batch_config
from libai.fleetx.yaml_loaders import resolve_name
from libai.runtime.core import seed_all
from libai.runtime.setup import setup_run
from libai.runtime.spec import (
    ActivationCheckpointSpec,
    AmpSpec,
    CheckpointerSpec,
    EvaluationSpec,
    LoRASpec,
    RunSpec,
    ZeroSpec,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MODULES",
    "amp_settings",
    "build_module",
    "dist_config",
    "resolve_module_class",
    "setup_yaml_run",
    "train_namespace",
]

#: ready-made task modules for the zoo, by the name a YAML's ``Model.module`` gives
MODULES = {
    "GPTModule": "libai.fleetx.modules.gpt.GPTModule",
    "LlamaSFTModule": "libai.fleetx.modules.llama.LlamaSFTModule",
    "SequenceClassificationModule": "libai.fleetx.modules.classification."
    "SequenceClassificationModule",
    "ImageClassificationModule": "libai.fleetx.modules.vit.ImageClassificationModule",
    # FleetX's GPT task modules by their names
    "GPTEvalModule": "libai.fleetx.modules.gpt_eval.GPTEvalModule",
    "GPTGenerationModule": "libai.fleetx.modules.gpt_generation.GPTGenerationModule",
    "GPTFinetuneModule": "libai.fleetx.modules.gpt_finetune.GPTFinetuneModule",
    "GeneralClsModule": "libai.fleetx.modules.general_cls.GeneralClsModule",
    "ErnieModule": "libai.fleetx.modules.ernie.ErnieModule",
    "ErnieSeqClsModule": "libai.fleetx.modules.ernie.ErnieSeqClsModule",
    "MoEModule": "libai.fleetx.modules.moe.MoEModule",
}
#: FleetX's module names with no implementation here (FleetX's ppfleetx/models/__init__.py)
#: -> the closest module that exists, if any
FLEETX_UNIMPLEMENTED = {
    "MOCOModule": None,
    "MOCOClsModule": None,
    "ImagenModule": None,
    "GPTModuleAuto": "GPTModule",
    "GPTGenerationModuleAuto": "GPTGenerationModule",
    "GeneralClsModuleAuto": "GeneralClsModule",
    "ErnieModuleAuto": "ErnieModule",
    "ErnieSeqClsModuleAuto": "ErnieSeqClsModule",
}
DEFAULT_SCHEDULE = "1F1B"
#: FleetX's recompute_granularity -> libai's activation checkpointing mode
RECOMPUTE_GRANULARITY = {
    "full": "full",
    "full_attn": "full_attn",
    "core_attn": "core_attn",
    "selective": "selective",
}
AMP_DTYPES = {"float16": "fp16", "fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16"}
DEVICES = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}
#: ``Model`` keys holding the layer count that pipeline stages are cut from
LAYER_COUNT_KEYS = ("hidden_layers", "num_layers", "num_hidden_layers", "depth")


def resolve_module_class(name: str):
    """The task module class ``Model.module`` names (a :data:`MODULES` name or a dotted
    import path); it must subclass :class:`~libai.fleetx.module.BasicModule`."""
    from libai.fleetx.module import BasicModule

    if name in FLEETX_UNIMPLEMENTED:
        closest = FLEETX_UNIMPLEMENTED[name]
        hint = f"the closest is {closest}; " if closest else ""
        raise YAMLConfigError(
            f"Model.module {name} (FleetX) is not implemented here; {hint}the task modules "
            f"that exist: {', '.join(sorted(MODULES))}, or a dotted path to your own BasicModule"
        )
    cls = resolve_name(name, MODULES, "Model.module")
    if not (isinstance(cls, type) and issubclass(cls, BasicModule)):
        raise YAMLConfigError(f"Model.module {name!r} is not a libai.engine.BasicModule subclass")
    return cls


def dist_config(cfg: DictConfig) -> dict:
    """LiBai's ``train.dist`` from ``Distributed`` (and ``Global.device``)."""
    d = cfg.Distributed
    if d.sharding.sharding_offload:
        raise YAMLConfigError(
            "Distributed.sharding.sharding_offload=True (CPU offload of sharded state) is not "
            "supported; set it to False"
        )
    sharding = d.sharding.sharding_degree
    if sharding > 1 and (d.dp_degree or 1) > 1:
        raise YAMLConfigError(
            f"Distributed.dp_degree={d.dp_degree} with sharding_degree={sharding} (replicate "
            "across groups, shard within: hybrid sharding) is not supported yet; set "
            "dp_degree=1 to shard over all data-parallel ranks"
        )
    device = str(cfg.Global.device).lower()
    if device not in DEVICES:
        raise YAMLConfigError(f"Global.device must be one of {sorted(DEVICES)}, got {device!r}")
    pp = d.pp_degree
    layers = d.pipeline_num_layers
    if pp > 1 and layers is None:
        found = [cfg.Model.get(k) for k in LAYER_COUNT_KEYS if cfg.Model.get(k) is not None]
        if not found:
            raise YAMLConfigError(
                f"Distributed.pp_degree={pp} needs the layer count: set "
                f"Distributed.pipeline_num_layers or one of Model.{', Model.'.join(LAYER_COUNT_KEYS)}"
            )
        layers = int(found[0]) + int(cfg.Model.get("num_decoder_layers") or 0)
    # FleetX's Model.virtual_pp_degree: model chunks per pipeline rank, run interleaved
    vpp = int(cfg.Model.get("virtual_pp_degree") or 1)
    schedule = d.pipeline_schedule
    if vpp > 1 and schedule == DEFAULT_SCHEDULE:
        schedule = "Interleaved1F1B"
    return {
        "data_parallel_size": (d.dp_degree or 1) * sharding,
        "tensor_parallel_size": d.mp_degree,
        "pipeline_parallel_size": pp,
        "pipeline_num_layers": layers,
        "device_type": DEVICES[device],
        "pipeline_schedule": schedule,
        "virtual_pipeline_size": vpp if pp > 1 else 1,
        # FleetX's Model.sequence_parallel: Megatron-style, over the mp group (needs mp > 1)
        "sequence_parallel": bool(cfg.Model.get("sequence_parallel")) and d.mp_degree > 1,
        # ours: each sequence split over cp_degree ranks (the model's attention across them)
        "context_parallel_size": int(d.get("cp_degree") or 1),
        # ours: experts of Mixture-of-Experts layers sharded over ep_degree ranks
        "expert_parallel_size": int(d.get("ep_degree") or 1),
    }


def amp_settings(cfg: DictConfig, mode: str = "train") -> tuple[bool, str, object]:
    """``(enabled, libai dtype, AutocastOpLists or None)`` of ``Engine.mix_precision``;
    off for export (FleetX does the same)."""
    from libai.runtime.amp_lists import AutocastOpLists

    mp = cfg.Engine.mix_precision
    if not mp.enable or mode == "export":
        return False, "bf16", None
    dtype = str(mp.dtype).lower()
    if dtype not in AMP_DTYPES:
        raise YAMLConfigError(
            f"Engine.mix_precision.dtype must be one of {sorted(AMP_DTYPES)}, got {mp.dtype!r}"
        )
    if str(mp.level or "O1").upper() not in ("O1", "O2"):  # null: FleetX's no decorate = O1
        raise YAMLConfigError(
            f"Engine.mix_precision.level={mp.level!r} is not supported: use O1 (autocast, "
            "fp32 parameters) or O2 (low-precision parameters, fp32 master weights)"
        )
    lists = AutocastOpLists(list(mp.custom_black_list or []), list(mp.custom_white_list or []))
    return True, AMP_DTYPES[dtype], (lists or None)


def train_namespace(
    cfg: DictConfig, *, train_iter: int, steps_per_epoch: int | None, mode: str, has_eval: bool
) -> RunSpec:
    """The run spec (:class:`~libai.runtime.spec.RunSpec`) of a resolved YAML config, which
    :mod:`libai.runtime.core` builds the runner, hooks and writers from.

    ``run_mode: step`` evaluates every ``eval_freq`` steps and saves every ``save_steps``;
    ``run_mode: epoch`` every ``eval_freq`` / ``save_epoch`` epochs (``steps_per_epoch``).
    """
    engine = cfg.Engine
    if engine.run_mode not in ("step", "epoch"):
        raise YAMLConfigError(f"Engine.run_mode must be 'step' or 'epoch', got {engine.run_mode!r}")
    per = 1
    if engine.run_mode == "epoch":
        if not steps_per_epoch:
            raise YAMLConfigError("Engine.run_mode=epoch needs a Data.Train section (its length)")
        per = steps_per_epoch
    save = engine.save_load
    save_every = save.save_steps if engine.run_mode == "step" else save.save_epoch
    save_period = save_every * per if save_every and save_every > 0 else train_iter + 1
    eval_period = engine.eval_freq * per if engine.eval_freq and engine.eval_freq > 0 else 0
    amp_on, amp_dtype, _ = amp_settings(cfg, mode)
    sharding = cfg.Distributed.sharding
    return RunSpec.from_config(
        dict(
            output_dir=save.output_dir,
            train_iter=int(train_iter),
            train_micro_batch_size=cfg.Global.micro_batch_size,
            global_batch_size=cfg.Global.global_batch_size,
            num_accumulation_steps=cfg.Engine.accumulate_steps,
            test_micro_batch_size=cfg.Global.local_batch_size,
            log_period=engine.logging_freq,
            seed=cfg.Global.seed,
            amp=AmpSpec(
                enabled=amp_on,
                dtype=amp_dtype,
                init_scale=engine.mix_precision.scale_loss,
                level=str(engine.mix_precision.level or "O1").upper(),
                fp8=engine.mix_precision.get("fp8") if mode == "train" else None,
            ),
            activation_checkpoint=recompute_spec(cfg),
            zero_optimization=ZeroSpec(
                enabled=mode == "train" and sharding.sharding_degree > 1,
                stage=sharding.sharding_stage,
            ),
            checkpointer=CheckpointerSpec(period=int(save_period), max_to_keep=save.max_to_keep),
            evaluation=EvaluationSpec(
                enabled=bool(has_eval and eval_period > 0),
                eval_period=int(eval_period),
                eval_iter=engine.eval_iters,
                eval_metric=None,
                eval_mode="min",
            ),
            dist=dist_config(cfg),
            # adapters in every mode: evaluation and export load a LoRA run's checkpoint
            lora=LoRASpec(**OmegaConf.to_container(cfg.Lora)),
        )
    )


def recompute_spec(cfg: DictConfig) -> ActivationCheckpointSpec:
    """``Model.use_recompute`` / ``recompute_granularity`` / ``no_recompute_layers`` as
    activation checkpointing: FleetX's full (the block), full_attn (the attention sub-layer),
    core_attn (the attention core), and libai's selective; the listed layers are not
    recomputed."""
    granularity = cfg.Model.get("recompute_granularity") or "full"
    if granularity not in RECOMPUTE_GRANULARITY:
        raise YAMLConfigError(
            f"Model.recompute_granularity={granularity!r}: use one of "
            f"{', '.join(RECOMPUTE_GRANULARITY)}"
        )
    skip = cfg.Model.get("no_recompute_layers") or []
    if not all(isinstance(i, int) and i >= 0 for i in skip):
        raise YAMLConfigError(
            f"Model.no_recompute_layers must be a list of layer indices >= 0, got {list(skip)}"
        )
    return ActivationCheckpointSpec(
        enabled=bool(cfg.Model.get("use_recompute", False)),
        mode=RECOMPUTE_GRANULARITY[granularity],
        no_recompute_layers=sorted(set(skip)),
    )


def setup_yaml_run(cfg: DictConfig, mode: str = "train") -> None:
    """Everything before the module: batch arithmetic and layout checks (no collective),
    the mesh, the output directory, the logger, the resolved ``config.yaml`` (rank 0), and
    the seed the model is built with."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    check_unsupported(cfg, mode)
    resolve_batch_config(cfg, world)
    dist_cfg = dist_config(cfg)
    dist.resolve_layout(dist_cfg, world)  # raises before any collective
    module_cls = resolve_module_class(cfg.Model.module)
    asked = [
        f"{kind} parallel (Distributed.{key}={dist_cfg[size]})"
        for kind, key, size in (
            ("tensor", "mp_degree", "tensor_parallel_size"),
            ("pipeline", "pp_degree", "pipeline_parallel_size"),
            ("context", "cp_degree", "context_parallel_size"),
        )
        if dist_cfg[size] > 1
    ]
    if asked and not module_cls.libai_model:
        raise YAMLConfigError(
            f"Model.module {module_cls.__name__} builds a plain nn.Module: {' and '.join(asked)} "
            "need a model built from libai layers. Use dp_degree / sharding for this module, "
            "or set `libai_model = True` on it if its get_model() returns a libai zoo model"
        )
    amp_settings(cfg, mode)  # raises for what autocast cannot express
    output_dir = cfg.Engine.save_load.output_dir

    def save_config():
        if dist.get_rank() == 0 and output_dir:
            path = os.path.join(output_dir, "config.yaml")
            OmegaConf.save(cfg, path, resolve=True)
            logger.info("Full config saved to %s", path)

    setup_run(dist_cfg, output_dir, seed=cfg.Global.seed, save_config=save_config)
    if dist.get_rank() == 0:
        announce_no_effect_keys(cfg)
        if cfg.Model.get("sequence_parallel") and cfg.Distributed.mp_degree == 1:
            logger.info(
                "FleetX key Model.sequence_parallel=True has no effect with mp_degree=1: "
                "sequence parallelism splits over the tensor-parallel group"
            )


def build_module(cfg: DictConfig):
    """``Model.module(cfg)``, built under ``Global.seed`` so every rank and layout starts
    from the same weights."""
    cls = resolve_module_class(cfg.Model.module)
    seed_all(cfg.Global.seed)
    with torch.device(dist.get_dist_util().device):
        return cls(cfg)


def yaml_argument_parser(description: str):
    """FleetX's command line: ``-c CONFIG [-o Key.sub=value ...]`` (``--config-file`` too, so
    ``tools/train.sh`` launches the YAML tools; bare ``Key=value`` words are overrides)."""
    import argparse

    parser = argparse.ArgumentParser(
        description=description,
        epilog="Example: bash tools/train.sh tools/train.py projects/gpt/configs/"
        "pretrain_gpt_345M_dp2.yaml 2 -o Engine.max_steps=20",
    )
    parser.add_argument("-c", "--config", "--config-file", required=True, metavar="YAML")
    parser.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override in Hydra's grammar, e.g. -o Engine.max_steps=10 (repeatable)",
    )
    parser.add_argument("opts", nargs="*", help="more overrides, KEY=VALUE")
    return parser


def engine_from_command_line(mode: str, description: str):
    """What every YAML tool does first: parse ``-c`` / ``-o``, load and check the config,
    :func:`setup_yaml_run`, build the module and the ``Engine`` in ``mode``."""
    from libai.fleetx.engine import Engine
    from libai.fleetx.yaml_config import load_yaml_config

    args = yaml_argument_parser(description).parse_args()
    sys.path.insert(0, os.getcwd())  # a user's own modules and datasets, by dotted path
    cfg = load_yaml_config(args.config, [*args.override, *args.opts])
    setup_yaml_run(cfg, mode)
    return Engine(cfg, build_module(cfg), mode=mode)
