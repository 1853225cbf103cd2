"""FleetX's YAML configs: ``_base_`` inheritance, ``-o`` overrides, checked keys, batch sizes.

A config has the sections of PaddleFleetX's::

    _base_: ./base.yaml            # merged under this file (recursively; relative path)
    Global:      {device, seed, global_batch_size, local_batch_size, micro_batch_size}
    Engine:      {run_mode, max_steps, num_train_epochs, accumulate_steps, logging_freq,
                  eval_freq, eval_iters, test_iters, compile,
                  mix_precision: {enable, dtype, level, scale_loss, custom_black_list,
                                  custom_white_list, fp8 (ours)},
                  save_load: {save_steps, save_epoch, output_dir, ckpt_dir, max_to_keep}}
    Model:       {module, use_recompute, recompute_granularity (full | selective), ...the
                  model's hyper-parameters}
    Data:        {Train|Eval|Test: {dataset: {name, ...}, sampler: {name, ...}, loader: {...}}}
    Optimizer:   {name, lr: {name, ...} or a number, grad_clip: {name, clip_norm}, ...}
    Distributed: {dp_degree, mp_degree, pp_degree, pipeline_num_layers, pipeline_schedule,
                  cp_degree (ours: context parallel), ep_degree (ours: expert
                  parallel, 1 until a model has Mixture-of-Experts layers),
                  sharding: {sharding_degree, sharding_stage, sharding_offload}}
    Inference:   {model_dir}

Merging (:func:`load_yaml_config`): a child mapping is merged key by key into its base's;
lists and scalars replace; a child mapping holding ``_inherited_: False`` replaces the base's
mapping wholesale. Overrides use Hydra's grammar (``Engine.max_steps=10``; ``+Model.x=1``
adds a key) and must fit the type of the value they replace (``Engine.max_steps expects an
int, got 'abc'``; the rules are :mod:`libai.config.overrides`'s, shared with LiBai's door).
Every key of the fixed sections is checked, in the file and again after the overrides: an
unknown one is an error naming the closest known key. ``Model``, the dataset / sampler
arguments and the optimizer's own arguments are checked where they are used (against the
constructor they go to).

Unlike FleetX, a user-set ``Engine.accumulate_steps`` that contradicts the batch sizes is an
error, never silently replaced (:func:`resolve_batch_config`).
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from libai.config.overrides import apply_overrides, has_key
from libai.config.resolve import BatchNames, batch_sizes
from libai.fleetx.fleetx_keys import OPEN_SECTIONS as FLEETX_OPEN_SECTIONS
from libai.fleetx.fleetx_keys import SCHEMA as FLEETX_SCHEMA
from libai.fleetx.fleetx_keys import SPLIT_KEYS, literal_values

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULTS",
    "YAMLConfigError",
    "check_keys",
    "load_yaml_config",
    "resolve_batch_config",
]


class YAMLConfigError(ValueError):
    """A YAML config that cannot be read, merged or that has keys or values that do not fit."""


#: every key of the fixed sections with its default (``None``: unset / derived). ``Model``,
#: ``Data`` and ``Optimizer`` are open: their extra keys go to the constructors they name.
DEFAULTS: dict[str, Any] = {
    "Global": {
        "device": "cpu",
        "seed": 1024,
        "global_batch_size": None,
        "local_batch_size": None,
        "micro_batch_size": None,
    },
    "Engine": {
        "run_mode": "step",
        "max_steps": None,
        "num_train_epochs": 1,
        "accumulate_steps": None,
        "logging_freq": 1,
        "eval_freq": -1,
        "eval_iters": 0,
        "test_iters": None,
        "compile": None,
        # FleetX's MoEModule: the weight of the experts' balancing loss (libai.fleetx.modules.moe)
        "balance_loss_weight": None,
        "mix_precision": {
            "enable": False,
            "dtype": "float16",
            "level": "O1",
            "scale_loss": 32768.0,
            "custom_black_list": None,
            "custom_white_list": None,
            "fp8": None,  # ours: "rowwise" / "tensorwise" float8 matmuls (train.amp.fp8)
        },
        "save_load": {
            "save_steps": -1,
            "save_epoch": -1,
            "output_dir": "./output",
            "ckpt_dir": None,
            "max_to_keep": None,
        },
    },
    "Model": {"module": None, "use_recompute": False, "recompute_granularity": "full"},
    "Data": {"Train": None, "Eval": None, "Test": None},
    "Optimizer": {"name": "AdamW", "lr": 1e-3, "grad_clip": None},
    "Distributed": {
        "dp_degree": None,
        "mp_degree": 1,
        "pp_degree": 1,
        "pipeline_num_layers": None,
        "pipeline_schedule": "1F1B",
        # ours (the name; Megatron's context_parallel_size): sequences split over cp
        "cp_degree": 1,
        # ours (FleetX's MoE name): experts sharded over this many data x context ranks
        "ep_degree": 1,
        # FleetX's communication-group class (HybridCommGroupForMoE in its MoE files): the
        # mesh's groups serve every layout here, this names none
        "hcg": None,
        "sharding": {"sharding_degree": 1, "sharding_stage": 1, "sharding_offload": False},
    },
    "Inference": {"model_dir": None},
    # ours (PEFT's field names, train.lora): adapters on the named layers, the rest frozen;
    # off while target_modules is empty
    "Lora": {
        "target_modules": [],
        "r": 8,
        "lora_alpha": 8.0,
        "lora_dropout": 0.0,
        "use_rslora": False,
        "modules_to_save": [],
    },
}
#: sections whose own keys are free (checked by the constructor they feed)
OPEN_SECTIONS = ("Model", "Optimizer")
#: FleetX's names of the batch sizes, for the shared rule's messages
BATCH_NAMES = BatchNames(
    "Global.micro_batch_size", "Global.global_batch_size", "Engine.accumulate_steps"
)
DATA_SPLIT_KEYS = ("dataset", "sampler", "loader")


# ---- reading and merging ----------------------------------------------------------------------
def _merge(base: dict, child: dict) -> dict:
    """``child`` merged into a copy of ``base`` (FleetX's rule, see the module doc)."""
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict):
            value = dict(value)
            inherited = value.pop("_inherited_", True)
            if inherited and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
                continue
        out[key] = copy.deepcopy(value)
    return out


def _read(path: str, chain: tuple[str, ...]) -> dict:
    path = os.path.abspath(path)
    if path in chain:
        cycle = " -> ".join([*chain, path])
        raise YAMLConfigError(f"_base_ files include each other: {cycle}")
    if not os.path.isfile(path):
        where = f" (the _base_ of {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"config file {path} does not exist{where}")
    try:
        with open(path, encoding="utf-8") as f:
            data = literal_values(yaml.safe_load(f) or {})  # FleetX literal_evals strings
    except yaml.YAMLError as exc:
        raise YAMLConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise YAMLConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    bases = data.pop("_base_", None)
    if bases is None:
        return data
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else list(bases):
        base_path = os.path.join(os.path.dirname(path), str(base))
        merged = _merge(merged, _read(base_path, (*chain, path)))
    return _merge(merged, data)


def _with_defaults(data: dict) -> dict:
    def fill(defaults: dict, given: dict | None) -> dict:
        given = {} if given is None else given
        out = dict(given)
        for key, default in defaults.items():
            if isinstance(default, dict) and isinstance(given.get(key), dict | None):
                out[key] = fill(default, given.get(key))
            elif key not in given:
                out[key] = copy.deepcopy(default)
        return out

    return fill(DEFAULTS, data)


# ---- checking ---------------------------------------------------------------------------------
def _unknown(key: str, known, where: str) -> YAMLConfigError:
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(f'{where}.{c}' for c in close)}?" if close else ""
    error = YAMLConfigError(
        f"unknown config key {where}.{key}{hint} (known: {', '.join(sorted(known))})"
    )
    error.key = key if where == "<top level>" else f"{where}.{key}"
    error.hint = hint
    return error


def check_keys(cfg: Any, allowed: Any, where: str) -> None:
    """Raise :class:`YAMLConfigError` for a key of ``cfg`` not in ``allowed``, naming the
    closest allowed key; recurses into nested mappings of :data:`DEFAULTS`."""
    if not hasattr(cfg, "items"):
        return
    for key, value in cfg.items():
        if key not in allowed:
            raise _unknown(str(key), allowed, where)
        sub = allowed[key] if isinstance(allowed, dict) else None
        if isinstance(sub, dict) and hasattr(value, "items"):
            check_keys(value, sub, f"{where}.{key}")


def _check(cfg: DictConfig) -> None:
    for section in cfg:
        if section not in DEFAULTS:
            raise _unknown(str(section), DEFAULTS, "<top level>")
    for section, allowed in DEFAULTS.items():
        if section in OPEN_SECTIONS:
            continue
        if section == "Data":
            check_keys(cfg.Data, allowed, "Data")
            for split in ("Train", "Eval", "Test"):
                node = cfg.Data.get(split)
                if node is not None:
                    check_keys(node, dict.fromkeys(DATA_SPLIT_KEYS + SPLIT_KEYS), f"Data.{split}")
                    if node.get("dataset") is None or node.dataset.get("name") is None:
                        raise YAMLConfigError(f"Data.{split}.dataset.name is required")
            continue
        check_keys(cfg[section], allowed, section)
    if not cfg.Model.get("module"):
        raise YAMLConfigError(
            "Model.module is required: a task module class name (e.g. GPTModule) or a dotted "
            "import path (e.g. projects.simple_net.module.SimpleNetModule)"
        )


def load_yaml_config(path: str | os.PathLike, overrides=()) -> DictConfig:
    """Read ``path`` with its ``_base_`` chain, fill :data:`DEFAULTS`, apply ``overrides``
    (``["Engine.max_steps=10", ...]``), then check every key -- after the overrides, as
    FleetX, so ``-o ~Section`` removes a section this door does not know. Returns a
    ``DictConfig``."""
    data = _with_defaults(_read(os.fspath(path), ()))
    cfg = OmegaConf.create(data, flags={"allow_objects": True})
    added = []
    for line in overrides:  # one at a time: a key an earlier override added exists
        line, new = _fleetx_override(cfg, line)
        added += new
        apply_overrides(cfg, [line])
    # a deleted key (``~Key``) is back at its default
    cfg = OmegaConf.create(
        _with_defaults(OmegaConf.to_container(cfg, resolve=False)), flags={"allow_objects": True}
    )
    while True:
        try:
            _check(cfg)
            return cfg
        except YAMLConfigError as error:  # an -o new field nothing reads: named, dropped
            key = getattr(error, "key", None)
            if key is None or not any(a == key or a.startswith(key + ".") for a in added):
                raise
            logger.warning(
                "FleetX key %s=%s (set by -o) has no effect here: no part of this door reads it%s",
                key,
                OmegaConf.select(cfg, key),
                error.hint,
            )
            parent, _, leaf = key.rpartition(".")
            del (OmegaConf.select(cfg, parent) if parent else cfg)[leaf]


def _fleetx_override(cfg: DictConfig, line: str) -> tuple[str, list[str]]:
    """FleetX's ``-o`` adds a key the config does not have ("A new field (...) detected!",
    Paddle's override): such an override becomes Hydra's ``+key=value``. Returns the
    override and the key it adds (if it adds one)."""
    key = line.partition("=")[0].strip()
    if "=" not in line or key[:1] in "+~" or has_key(cfg, key):
        return line, []
    logger.warning("A new field (%s) detected!", key)
    return "+" + line.lstrip(), [key]


# ---- derived values ---------------------------------------------------------------------------
def _positive(value, key: str, allow_none=True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise YAMLConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def resolve_batch_config(cfg: DictConfig, world_size: int) -> DictConfig:
    """Fill the derived sizes in place: ``Distributed.dp_degree`` and the batch sizes.

    ``dp_degree × sharding_degree × mp_degree × pp_degree`` must be the process count
    (``dp_degree`` is derived when unset). With ``n = dp_degree × sharding_degree`` data
    ranks: ``global_batch_size = local_batch_size × n`` (either may be derived),
    ``local_batch_size = micro_batch_size × accumulate_steps`` (``micro_batch_size``
    defaults to the local batch; ``accumulate_steps`` is derived, and a given value must
    agree). Returns ``cfg``.
    """
    d = cfg.Distributed
    mp = _positive(d.mp_degree, "Distributed.mp_degree", allow_none=False)
    pp = _positive(d.pp_degree, "Distributed.pp_degree", allow_none=False)
    sharding = _positive(d.sharding.sharding_degree, "Distributed.sharding.sharding_degree", False)
    dp = _positive(d.dp_degree, "Distributed.dp_degree")
    cp = _positive(d.get("cp_degree", 1), "Distributed.cp_degree", allow_none=False)
    ep = _positive(d.get("ep_degree", 1), "Distributed.ep_degree", allow_none=False)
    model_ranks = mp * pp * sharding * cp
    sizes = f"mp_degree {mp} x pp_degree {pp} x sharding_degree {sharding}" + (
        f" x cp_degree {cp}" if cp > 1 else ""
    )
    if dp is None:
        if world_size % model_ranks:
            raise YAMLConfigError(
                f"{world_size} processes are not divisible by {sizes} = {model_ranks}; launch "
                f"a multiple of {model_ranks}"
            )
        dp = world_size // model_ranks
    if dp * model_ranks != world_size:
        raise YAMLConfigError(
            f"Distributed: dp_degree {dp} x {sizes} = {dp * model_ranks}, but {world_size} "
            "processes were launched"
        )
    moe = cfg.Model.get("moe_configs")
    if cfg.Model.get("module") == "MoEModule" and moe and moe.get("expert_mode"):
        if ep not in (1, dp):
            raise YAMLConfigError(
                f"Distributed.ep_degree={ep}: FleetX's expert_mode places the experts over "
                f"the {dp} data-parallel ranks; leave ep_degree unset"
            )
        ep = dp  # FleetX's expert group is the data-parallel group
        d.ep_degree = dp
    if ep > 1 and dp % ep:
        raise YAMLConfigError(
            f"Distributed.ep_degree={ep} must divide the {dp} data-parallel ranks the experts "
            "are split over"
        )
    d.dp_degree = dp
    n = dp * sharding
    g = cfg.Global
    glob = _positive(g.global_batch_size, "Global.global_batch_size")
    local = _positive(g.local_batch_size, "Global.local_batch_size")
    micro = _positive(g.micro_batch_size, "Global.micro_batch_size")
    if local is not None and glob is not None and glob != local * n:
        raise YAMLConfigError(
            f"Global.global_batch_size {glob} != local_batch_size {local} x {n} data-parallel "
            "ranks (dp_degree x sharding_degree)"
        )
    if glob is None and local is not None:
        glob = local * n
    if micro is None and local is not None:
        micro = local  # FleetX: the micro batch defaults to the local one
    given = _positive(cfg.Engine.accumulate_steps, "Engine.accumulate_steps")
    try:  # the rule every door shares (libai.config.resolve)
        micro, glob, acc = batch_sizes(micro, glob, given, n, BATCH_NAMES)
    except ValueError as err:
        raise YAMLConfigError(f"{err} (data-parallel ranks: dp_degree x sharding_degree)") from None
    local = glob // n
    g.global_batch_size, g.local_batch_size, g.micro_batch_size = glob, local, micro
    cfg.Engine.accumulate_steps = acc
    if cfg.Engine.test_iters is None:
        cfg.Engine.test_iters = cfg.Engine.eval_iters * 10
    return cfg


# ---- FleetX's task sections, read by the task modules that use them ---------------------------
# Offline_Eval: GPTEvalModule (checks its keys); Generation: GPTGenerationModule (checks its
# keys). Open here: set only when a module reads them.
DEFAULTS.setdefault("Offline_Eval", None)
DEFAULTS.setdefault("Generation", None)
OPEN_SECTIONS = (
    *OPEN_SECTIONS,
    *(s for s in ("Offline_Eval", "Generation") if s not in OPEN_SECTIONS),
)


# ---- FleetX's own keys (libai.fleetx.fleetx_keys says what each does here) -------------------
def _merge_schema(into: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_schema(into[key], value)
        else:
            into.setdefault(key, copy.deepcopy(value))


_merge_schema(DEFAULTS, FLEETX_SCHEMA)
for _section in FLEETX_OPEN_SECTIONS:
    DEFAULTS.setdefault(_section, None)
OPEN_SECTIONS = (*OPEN_SECTIONS, *(s for s in FLEETX_OPEN_SECTIONS if s not in OPEN_SECTIONS))
