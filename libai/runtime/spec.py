"""The run spec: the typed settings the runtime reads, one schema for every front door.

A door translates its own syntax into a :class:`RunSpec` -- LiBai's ``train`` namespace
(:meth:`RunSpec.from_config`), FleetX's YAML sections (``libai.fleetx.yaml_setup``),
Rapidformer's flags (``libai.accelerate.arguments``) -- and the runtime builds the runner,
optimizer sharding, hooks and writers from it. The resolvers here are the only place a
switch is turned into what runs (the AMP dtype, the ZeRO stage a layout allows, the
activation-checkpointing mode, compile on or off); the trainer and the memory estimator
both call them.

The field names are LiBai's (``configs/common/train.py`` is the same schema written as
LiBai's config file; a test keeps the two equal). Keys of LiBai's ``train`` that hold
objects for the door to build (``scheduler``, ``evaluation.evaluator``) are not part of it.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from libai import dist
from libai.layers.checkpointing import resolve_mode
from libai.layers.float8 import check_recipe
from libai.models.lora import LoRAConfig
from libai.runtime.amp import resolve_amp_dtype
from libai.runtime.zero import resolve_zero_stage

__all__ = [
    "ActivationCheckpointSpec",
    "AmpSpec",
    "CheckpointerSpec",
    "DistSpec",
    "EvaluationSpec",
    "LoRASpec",
    "RunSpec",
    "ZeroSpec",
    "as_spec_lora",
    "resolve_compile",
]

logger = logging.getLogger(__name__)


class _Freezable:
    """A spec that refuses assignment once :meth:`RunSpec.freeze` froze it: the runtime
    built the run from it, so a later change would describe a run that is not the one
    running."""

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"the run spec is frozen once the run is built: {type(self).__name__}.{name} "
                "cannot change now; set it before libai.runtime.run.Run(...)"
            )
        object.__setattr__(self, name, value)


#: keys of LiBai's ``train`` that the door builds itself (objects, not settings)
DOOR_KEYS = {"scheduler": None, "evaluation": {"evaluator": None}}

#: keys LiBai's ``configs/common/train.py`` carries that mean nothing on torch: accepted,
#: named in one log line (key -> why)
NO_EFFECT_KEYS = {
    "nccl_fusion_threshold_mb": "OneFlow's NCCL fusion; gradients are bucketed by the runtime",
    "nccl_fusion_max_ops": "OneFlow's NCCL fusion; gradients are bucketed by the runtime",
    "input_placement_device": "batches are moved to each rank's device by the runtime",
    "rdma_enabled": "OneFlow's RDMA switch; torch.distributed picks the transport",
    # LiBai's swin / vit ImageNet configs set it; LiBai's trainer reads only
    # train.evaluation.eval_period, so it does nothing there either
    "eval_period": "LiBai reads train.evaluation.eval_period; set that one",
    # LiBai's QQP project sets it; LiBai reads only the evaluator's own topk
    "topk": "LiBai reads train.evaluation.evaluator.topk; set that one",
}


@dataclass
class AmpSpec(_Freezable):
    """Mixed precision: autocast to ``dtype`` ("bf16" or "fp16"); fp16 adds a dynamic loss
    scaler starting at ``init_scale``. ``level`` "O1" keeps fp32 parameters (autocast only);
    "O2" also stores parameters and gradients in ``dtype`` with fp32 master weights in the
    optimizer (:mod:`libai.runtime.master_weights`). ``fp8`` "rowwise" or "tensorwise"
    (torchao's recipes) runs the large Linear layers' matmuls in float8
    (:mod:`libai.layers.float8`); None: off. ``fp8_min_size`` False converts every layer
    whose dims divide by 16, not only those large enough to gain on an H100."""

    enabled: bool = False
    dtype: str = "bf16"
    init_scale: float = 65536.0
    level: str = "O1"
    fp8: str | None = None
    fp8_min_size: bool = True

    def fp8_recipe(self) -> str | None:
        """The checked float8 recipe, ``None`` when off; a wrong name raises naming the key."""
        return check_recipe(self.fp8)

    def torch_dtype(self) -> torch.dtype | None:
        """The autocast dtype, ``None`` for fp32; an unknown name raises naming the key."""
        return resolve_amp_dtype(self.dtype) if self.enabled else None

    def master_weights(self) -> bool:
        """Whether the run keeps low-precision parameters with fp32 masters (level O2)."""
        level = str(self.level).upper()
        if level not in ("O1", "O2"):
            raise ValueError(f"amp.level must be 'O1' or 'O2', got {self.level!r}")
        return self.enabled and level == "O2"


@dataclass
class ActivationCheckpointSpec(_Freezable):
    """Recompute each Transformer layer in backward: ``mode`` "full", "selective", or
    (FleetX's granularities) "full_attn" / "core_attn"; ``no_recompute_layers``: layer
    indices left out."""

    enabled: bool = False
    mode: str = "full"
    no_recompute_layers: list[int] = field(default_factory=list)

    def resolved(self) -> str | None:
        """``None`` when off, else the checked mode."""
        return resolve_mode(self.enabled and (self.mode or "full"))


@dataclass
class ZeroSpec(_Freezable):
    """ZeRO: stage 1 shards optimizer state, 2 also gradients, 3 also parameters (FSDP2);
    ``hsdp_replicate_size`` > 1 (stage 3): replicate across that many groups."""

    enabled: bool = False
    stage: int = 1
    hsdp_replicate_size: int = 1

    def resolved_stage(self, layout: dist.DistLayout) -> int | None:
        """The stage ``layout`` runs (``None`` when off); raises, before any collective, for
        a stage the layout cannot apply."""
        return resolve_zero_stage(dataclasses.asdict(self), layout)


@dataclass
class CheckpointerSpec(_Freezable):
    """Save every ``period`` iterations, keep this run's last ``max_to_keep`` (None: all)."""

    period: int = 5000
    max_to_keep: int | None = 100
    #: LiBai's: save every this many epochs instead (``period`` = n x steps per epoch)
    save_model_after_n_epoch: int | None = None


@dataclass
class EvaluationSpec(_Freezable):
    """Evaluate every ``eval_period`` iterations on at most ``eval_iter`` batches; keep the
    best checkpoint by ``eval_metric`` (``eval_mode`` "min" or "max"; None: no best)."""

    enabled: bool = True
    eval_period: int = 5000
    eval_iter: int = 100000
    eval_metric: str | None = "PPL"
    eval_mode: str = "min"
    #: LiBai's: evaluate every this many epochs instead (``eval_period`` = n x steps per epoch)
    eval_after_n_epoch: int | None = None


@dataclass
class LoRASpec(_Freezable):
    """LoRA with PEFT's field names: adapters on the layers ``target_modules`` names (PEFT's
    Hugging Face names or libai's), every other weight frozen but ``modules_to_save``; off
    while ``target_modules`` is empty (see :mod:`libai.models.lora`)."""

    target_modules: list[str] = field(default_factory=list)
    r: int = 8
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    use_rslora: bool = False
    modules_to_save: list[str] = field(default_factory=list)

    def config(self):
        """The :class:`~libai.models.lora.LoRAConfig` (None when off); a bad value raises
        naming the key."""
        if not self.target_modules:
            return None
        return LoRAConfig.of(
            {
                "target_modules": tuple(self.target_modules),
                "r": self.r,
                "lora_alpha": self.lora_alpha,
                "lora_dropout": self.lora_dropout,
                "use_rslora": self.use_rslora,
                "modules_to_save": tuple(self.modules_to_save),
            }
        )


@dataclass
class DistSpec(_Freezable):
    """``train.dist``: the parallel layout, typed (the keys of
    :data:`libai.dist.DIST_CONFIG_KEYS`; a test keeps the two equal). The sizes are checked
    against the world size by :func:`libai.dist.resolve_layout` before any process group."""

    data_parallel_size: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_num_layers: int | None = None
    custom_pipeline_stage_id: list[int] | None = None
    device_type: str = "cpu"
    virtual_pipeline_size: int = 1
    pipeline_schedule: str = "1F1B"
    sequence_parallel: bool = False
    context_parallel_size: int = 1
    expert_parallel_size: int = 1


@dataclass
class RunSpec(_Freezable):
    """Every setting of a run the runtime reads (LiBai's ``train`` keys)."""

    output_dir: str = "./output"
    train_iter: int = 10000
    train_epoch: int = 0
    train_micro_batch_size: int = 32
    global_batch_size: int | None = None
    num_accumulation_steps: int | None = None
    test_micro_batch_size: int = 32
    log_period: int = 20
    seed: int = 1234
    warmup_ratio: float = 0.0
    #: filled by the trainer: ``ceil(train_iter * warmup_ratio)``
    warmup_iter: int | None = None
    start_iter: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    train_samples: int | None = None
    load_weight: str = ""
    resume: bool = False
    amp: AmpSpec = field(default_factory=AmpSpec)
    activation_checkpoint: ActivationCheckpointSpec = field(
        default_factory=ActivationCheckpointSpec
    )
    zero_optimization: ZeroSpec = field(default_factory=ZeroSpec)
    checkpointer: CheckpointerSpec = field(default_factory=CheckpointerSpec)
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    lora: LoRASpec = field(default_factory=LoRASpec)
    #: the parallel layout (a mapping of its keys is taken too, checked and typed)
    dist: DistSpec = field(default_factory=DistSpec)

    def __post_init__(self):
        if not isinstance(self.dist, DistSpec):
            self.dist = DistSpec(**dist.dist_config_items(self.dist))

    @classmethod
    def from_config(cls, train) -> RunSpec:
        """The spec of LiBai's ``train`` namespace (a DictConfig or mapping): every key the
        spec names, typed and checked by OmegaConf's structured config -- a value of the
        wrong type, or a key neither the spec nor the door knows, raises naming it. Every
        door builds its spec here (FleetX's and Rapidformer's from the mapping they
        translate to)."""
        data = train
        if isinstance(train, DictConfig):
            data = OmegaConf.to_container(train, resolve=True)
        data = _integral_floats_as_ints(_without_door_keys(dict(data), DOOR_KEYS), cls)
        # a door's nested spec objects as mappings: every error names the key's full path
        data = {
            k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in data.items()
        }
        dist.dist_config_items(data.get("dist"))  # an unknown layout key: named with close ones
        ignored = sorted(k for k in NO_EFFECT_KEYS if data.pop(k, None) is not None)
        if ignored:
            logger.info(
                "train keys with no effect here: %s",
                "; ".join(f"{k} ({NO_EFFECT_KEYS[k]})" for k in ignored),
            )
        try:
            merged = OmegaConf.merge(OmegaConf.structured(cls), data)
        except OmegaConfBaseException as err:
            raise ValueError(_error_line(err)) from None
        spec = OmegaConf.to_object(merged)
        spec.amp.fp8_recipe()  # a wrong recipe name: raised here, naming the key
        return spec

    @classmethod
    def fill_defaults(cls, train) -> list[str]:
        """Add to LiBai's ``train`` namespace (a DictConfig, in place) every key of the spec
        it leaves out, with the spec's default -- LiBai's own ``train.py`` has no
        ``amp.dtype`` or ``resume``, for example. Returns the keys added."""
        added: list[str] = []
        _fill(train, dataclasses.asdict(cls()), "", added)
        return added

    def freeze(self) -> RunSpec:
        """Refuse any later assignment, here and in the nested specs; returns ``self``."""
        for spec in (self, *(getattr(self, f.name) for f in dataclasses.fields(self))):
            if dataclasses.is_dataclass(spec):
                object.__setattr__(spec, "_frozen", True)
        return self

    @property
    def frozen(self) -> bool:
        return bool(self.__dict__.get("_frozen"))

    def to_yaml(self) -> str:
        """The spec as YAML (what a run's ``run_spec.yaml`` and its log show)."""
        return OmegaConf.to_yaml(OmegaConf.structured(self))

    # ---- resolvers ------------------------------------------------------------------------
    def amp_dtype(self) -> torch.dtype | None:
        return self.amp.torch_dtype()

    def zero_stage(self, layout: dist.DistLayout) -> int | None:
        return self.zero_optimization.resolved_stage(layout)

    def checkpointing(self) -> str | None:
        return self.activation_checkpoint.resolved()


def resolve_compile(enabled, device_type: str) -> bool:
    """``graph.enabled``: ``None`` means compile on CUDA (where it pays) and not on CPU."""
    if enabled is None:
        return device_type == "cuda"
    return bool(enabled)


def _error_line(err: OmegaConfBaseException) -> str:
    """One line naming the ``train`` key of a structured-config error (and, for an unknown
    key, the close valid ones)."""
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError):
        parent, _, name = key.rpartition(".")
        node = RunSpec()
        for part in filter(None, parent.split(".")):
            node = getattr(node, part)
        valid = [f.name for f in dataclasses.fields(node)]
        close = difflib.get_close_matches(name, valid, n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"unknown config key train.{key}{hint}; valid keys: {', '.join(valid)}"
    return f"train.{key}: {str(err.msg).splitlines()[0]}"


def _fill(node, defaults: dict, path: str, added: list[str]) -> None:
    for key, value in defaults.items():
        if key not in node:
            node[key] = value
            added.append(f"{path}{key}")
        elif isinstance(value, dict) and hasattr(node[key], "items"):
            _fill(node[key], value, f"{path}{key}.", added)


def _integral_floats_as_ints(data: dict, spec_cls) -> dict:
    """Whole-number floats where the spec wants an int (LiBai's ``eval_iter=1e5``)."""
    fields = {f.name: f for f in dataclasses.fields(spec_cls)}
    out = dict(data)
    for key, value in data.items():
        field_ = fields.get(key)
        if field_ is None:
            continue
        kinds = str(field_.type).replace(" ", "").split("|")
        if isinstance(value, float) and "int" in kinds and "float" not in kinds:
            out[key] = int(value) if value.is_integer() else value
        elif isinstance(value, dict) and field_.default_factory is not dataclasses.MISSING:
            sub = field_.default_factory()
            if dataclasses.is_dataclass(sub):
                out[key] = _integral_floats_as_ints(value, type(sub))
    return out


def _without_door_keys(data: dict, door: dict) -> dict:
    """``data`` without the door-owned keys of ``door`` (nested)."""
    out = {}
    for key, value in data.items():
        if key in door and door[key] is None:
            continue
        if key in door and isinstance(value, dict):
            value = _without_door_keys(value, door[key])
        out[key] = value
    return out


def as_spec_lora(cfg):
    """The LoRA settings of a loaded run config (its ``train.lora``), or None when off."""
    lora = cfg.get("train", {}).get("lora") if hasattr(cfg, "get") else None
    if not lora:
        return None
    return LoRASpec(**dict(lora)).config()
