"""LoRA on a libai model, with PEFT's names: which layers, applying, merging, PEFT files.

:class:`LoRAConfig` takes PEFT's fields (``r``, ``lora_alpha``, ``lora_dropout``,
``use_rslora``, ``target_modules``, ``modules_to_save``). Targets are named as PEFT names them
on the Hugging Face model (``q_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``c_attn``, ...)
or by libai's own layer names (``query_key_value``, ``dense``, ``dense_h_to_4h``,
``dense_gate``, ``dense_4h_to_h``); a string is a regular expression matched against the
full module name (either library's), as in PEFT. The correspondence comes from the model's
Hugging Face weight mapping (:mod:`libai.models.utils.weight_mapping`): a one-to-one weight is
one layer; a fused query/key/value projection built from separate ``q_proj`` / ``k_proj`` /
``v_proj`` takes one adapter per segment, one built from GPT-2's single ``c_attn`` one shared
A with its B rows split into q, k, v.

:func:`apply_lora` attaches the adapters (:class:`libai.layers.lora.LoRA`) and freezes every
other parameter (``requires_grad=False``: no gradient, no optimizer state), except those of
``modules_to_save``. :func:`merge_lora` folds the adapters into the base weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from libai import dist
from libai.layers.attention import MultiheadAttention
from libai.layers.embedding import VocabEmbedding
from libai.layers.linear import Linear
from libai.layers.lora import EmbeddingLoRA, LoRA, QKVLayout
from libai.layers.param import local_value
from libai.models.utils.weight_mapping import Copy, GroupedFuse
from libai.utils.keys import dataclass_items

SEGMENTS = ("q", "k", "v")


@dataclass(frozen=True)
class LoRAConfig:
    """PEFT's LoRA settings (``LoraConfig``'s field names)."""

    target_modules: tuple[str, ...] | str = ()
    r: int = 8
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    use_rslora: bool = False
    modules_to_save: tuple[str, ...] = field(default_factory=tuple)
    bias: str = "none"

    def __post_init__(self):
        if not self.target_modules:
            raise ValueError(
                "lora.target_modules is empty: name the layers to adapt, e.g. "
                "['q_proj', 'v_proj'] (PEFT's names) or ['query_key_value'] (libai's)"
            )
        if not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"lora.r={self.r!r}: the rank must be an integer >= 1")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora.lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if self.bias != "none":
            raise ValueError(f"lora.bias={self.bias!r}: only 'none' is supported (PEFT's default)")

    @classmethod
    def of(cls, value) -> LoRAConfig | None:
        """``value`` (a mapping, an omegaconf node, a LoRAConfig or None) as a LoRAConfig;
        an unknown key raises naming the closest valid one."""
        if value is None or isinstance(value, LoRAConfig):
            return value
        items = dataclass_items(cls, value, "lora")
        for key in ("target_modules", "modules_to_save"):
            if key in items and not isinstance(items[key], str):
                items[key] = tuple(items[key] or ())
        return cls(**items)

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (self.r**0.5 if self.use_rslora else self.r)


@dataclass
class Target:
    """One adaptable libai Linear: its Hugging Face module names (``segment -> name``;
    ``""`` for a one-to-one layer) and how a fused projection's segments share A."""

    module: str
    hf: dict[str, str]
    shared_a: bool = False
    transpose: bool = False  # the Hugging Face weight is a Conv1D ([in, out])

    def names(self) -> set[str]:
        """Every name a pattern may use for this layer."""
        leaf = self.module.rsplit(".", 1)[-1]
        return (
            {self.module, leaf}
            | set(self.hf.values())
            | {n.rsplit(".", 1)[-1] for n in self.hf.values()}
        )


#: the layers an adapter can target
ADAPTABLE = (Linear, VocabEmbedding)


def lora_targets(model: nn.Module, elsewhere: bool = False) -> dict[str, Target]:
    """The adaptable layers of ``model`` (Linear, and the token embedding as PEFT's
    ``embed_tokens`` / ``wte``) by libai module name, with their Hugging Face names (from
    the model's weight mapping when it has one). ``elsewhere``: instead, the mapped layers
    this model lacks (a pipeline stage's: those of the other stages)."""
    rules = weight_rules(model)
    out: dict[str, Target] = {}
    for rule in rules:
        if not rule.libai_name.endswith(".weight"):
            continue
        module = rule.libai_name[: -len(".weight")]
        if isinstance(rule, Copy):
            out[module] = Target(
                module, {"": rule.hf_name[: -len(".weight")]}, False, rule.transpose
            )
        elif isinstance(rule, GroupedFuse) and len(rule.sources) == 3:
            names = [s.name[: -len(".weight")] for s in rule.sources]
            shared = len(set(names)) == 1
            hf = {"": names[0]} if shared else dict(zip(SEGMENTS, names))
            out[module] = Target(module, hf, shared, rule.sources[0].transpose)
    if elsewhere:
        return {n: t for n, t in out.items() if _get(model, n) is None}
    for name, layer in model.named_modules():  # layers without a Hugging Face twin
        if isinstance(layer, ADAPTABLE) and name not in out:
            out[name] = Target(name, {})
    return {n: t for n, t in out.items() if isinstance(_get(model, n), ADAPTABLE)}


def weight_rules(model: nn.Module) -> list:
    """The Hugging Face weight-mapping rules of ``model`` (empty for a model without one)."""
    from libai.models.utils import loader_for_model
    from libai.models.utils.hf_export import model_libai_cfg
    from libai.models.utils.model_loader.base_loader import libai_class

    try:
        loader = loader_for_model(model)
    except TypeError:
        return []
    return loader.rules(model_libai_cfg(model), libai_class(model))


def _get(model: nn.Module, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _matches(pattern: str, target: Target, regex: bool) -> bool:
    if regex:
        return any(re.fullmatch(pattern, n) for n in (target.module, *target.hf.values()))
    return pattern in target.names() or any(
        n.endswith("." + pattern) for n in (target.module, *target.hf.values())
    )


def resolve_targets(model: nn.Module, config: LoRAConfig) -> dict[str, tuple[Target, tuple]]:
    """``{libai module: (target, segments or None)}`` that ``config.target_modules`` names;
    a name that matches no layer raises, listing the names there are."""
    targets = lora_targets(model)
    regex = isinstance(config.target_modules, str)
    patterns = [config.target_modules] if regex else list(config.target_modules)
    chosen: dict[str, set] = {}
    for pattern in patterns:
        hit = False
        for module, target in targets.items():
            if not _matches(pattern, target, regex):
                continue
            hit = True
            segs = chosen.setdefault(module, set())
            if set(target.hf) == set(SEGMENTS):  # separate q/k/v: the segments it names
                fused = Target(module, {})  # the libai name alone
                named = [
                    s
                    for s in SEGMENTS
                    if _matches(pattern, Target(module, {s: target.hf[s]}), regex)
                    and not _matches(pattern, fused, regex)
                ]
                segs.update(named or SEGMENTS)  # libai's fused name: all three
            else:
                segs.add("")
        if not hit and _names_another_stage(model, pattern, regex):
            continue  # a pipeline stage: the layers it names live on other stages
        if not hit:
            known = sorted({n for t in targets.values() for n in t.names() if "." not in n})
            raise ValueError(
                f"lora.target_modules: {pattern!r} matches no Linear or embedding layer of "
                f"{type(model).__name__}; layer names here: {known}"
            )
    out = {}
    for module, segs in chosen.items():
        target = targets[module]
        segments = tuple(s for s in SEGMENTS if s in segs) if "" not in segs else None
        if target.shared_a:
            segments = SEGMENTS
        out[module] = (target, segments)
    return out


def _names_another_stage(model: nn.Module, pattern: str, regex: bool) -> bool:
    """Whether ``pattern`` names a layer of the whole model that this pipeline stage lacks."""
    if dist.mesh_of(model).layout.pipeline_parallel_size == 1:
        return False
    return any(_matches(pattern, t, regex) for t in lora_targets(model, elsewhere=True).values())


def _qkv_of(model: nn.Module, module: str) -> tuple[QKVLayout, dict[str, int]]:
    parent = _get(model, module.rsplit(".", 1)[0])
    if not isinstance(parent, MultiheadAttention):
        raise ValueError(f"{module}: segment adapters need a fused attention projection")
    d = parent.head_size
    layout = QKVLayout(parent.local_kv_heads, parent.group_size, d)
    full = {"q": parent.num_heads * d, "k": parent.num_kv_heads * d, "v": parent.num_kv_heads * d}
    return layout, full


#: the model attribute holding the LoRA settings applied to it (set on the whole model, before
#: any pipeline split, so every stage agrees that it is a LoRA model)
LORA_ATTR = "libai_lora_config"
#: set on the whole model (before any pipeline split) when an adapter targets the embedding
EMBEDDING_ATTR = "libai_lora_embedding"


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Attach ``config``'s adapters to ``model`` (in place) and freeze every other
    parameter but those of ``modules_to_save``; returns the adapted module names."""
    chosen = resolve_targets(model, config)
    for module, (target, segments) in chosen.items():
        linear = _get(model, module)
        if linear.lora is not None:
            raise ValueError(f"{module} already has a LoRA adapter")
        embedding = isinstance(linear, VocabEmbedding)
        sizes = (
            (linear.num_embeddings, linear.embedding_dim)
            if embedding
            else (linear.in_features, linear.out_features)
        )
        if config.r > min(sizes):
            raise ValueError(
                f"lora.r={config.r} exceeds {module}'s smaller dimension ({min(sizes)}): a "
                "rank above it adds nothing; choose r <= " + str(min(sizes))
            )
        if embedding:  # PEFT's embedding adapter (no dropout, as PEFT)
            linear.lora = EmbeddingLoRA(linear, config.r, config.lora_alpha, config.use_rslora)
            model.__dict__[EMBEDDING_ATTR] = True
            continue
        qkv = full = None
        if segments is not None:
            qkv, full = _qkv_of(model, module)
        linear.lora = LoRA(
            linear,
            config.r,
            config.lora_alpha,
            config.lora_dropout,
            config.use_rslora,
            segments=segments,
            qkv=qkv,
            full_widths=full,
            shared_a=target.shared_a,
        )
        linear.lora.train(linear.training)  # an eval model's adapters drop nothing
    saved = _modules_to_save(model, config.modules_to_save)
    for name, param in model.named_parameters():
        keep = getattr(param, "libai_lora", False) or any(name.startswith(m + ".") for m in saved)
        param.requires_grad_(keep)
    model.__dict__[LORA_ATTR] = config
    return sorted(chosen)


def _modules_to_save(model: nn.Module, names) -> list[str]:
    """The libai modules ``names`` designate: libai module names, or Hugging Face ones (as
    PEFT's ``modules_to_save``), each matching a whole name or its last components."""

    def named(module: str, wanted: str) -> bool:
        return module == wanted or module.endswith("." + wanted)

    twins = {}  # Hugging Face module -> libai module, from the weight mapping
    for rule in weight_rules(model) if names else ():
        libai = rule.libai_name.rsplit(".", 1)[0]
        for hf in rule.hf_names():
            twins[hf.rsplit(".", 1)[0]] = libai
    out = []
    for wanted in names:
        found = [n for n, _ in model.named_modules() if named(n, wanted)]
        found += [libai for hf, libai in twins.items() if named(hf, wanted)]
        found = sorted({n for n in found if _get(model, n) is not None})
        if not found:
            raise ValueError(f"lora.modules_to_save: {wanted!r} names no module of the model")
        out += found
    return out


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers of ``model`` (Linear, token embedding) that carry an adapter, by name."""
    return {
        n: m for n, m in model.named_modules() if isinstance(m, ADAPTABLE) and m.lora is not None
    }


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its base weight (in place, on any layout: tp shards, ZeRO-3
    shards) and remove it; returns the number of layers merged. The model then computes
    what it computed with the adapters (dropout aside), at no adapter cost. Collective
    where the weights are sharded: every rank calls it."""
    layers = lora_layers(model)
    for layer in layers.values():
        deltas = layer.lora.delta_weight()
        weight = layer.weight
        if layer.lora.segments is None:
            delta = deltas[""]
        else:  # each segment's rows of the fused [groups, (g + 2) * d, in] weight
            qkv = layer.lora.qkv
            d, g = qkv.head_size, qkv.g
            groups = weight.shape[0] // ((g + 2) * d)  # the whole weight's groups
            widths = {"q": g * d, "k": d, "v": d}
            some = next(iter(deltas.values()))
            pieces = [
                deltas[s].view(groups, widths[s], -1)
                if s in deltas
                else some.new_zeros(groups, widths[s], weight.shape[1])
                for s in SEGMENTS
            ]
            delta = torch.cat(pieces, dim=1).view(weight.shape[0], -1)
        _add_whole(weight, delta)
        layer.lora = None
    if model.__dict__.pop(EMBEDDING_ATTR, False):
        _sync_tied_copies(model)
    model.__dict__.pop(LORA_ATTR, None)
    return len(layers)


def _sync_tied_copies(model: nn.Module) -> None:
    """After an embedding adapter merged into the table: a tied LM head on another pipeline
    stage holds a copy of the table; it takes the merged value, as the one shared weight of
    a tied model does on one stage (and in PEFT's ``merge_and_unload``). Collective over
    the first and last stages."""
    util = dist.mesh_of(model)
    tied = [p for p in model.parameters() if getattr(p, "libai_tied_group", None) is not None]
    if util.embedding_group is None or not tied:
        return
    for p in tied:
        local = local_value(p)
        if getattr(p, "libai_tied_copy", False):
            local.zero_()  # the copy: replaced by the table's merged value
        torch_dist.all_reduce(local, group=util.embedding_group)


def _add_whole(weight: torch.Tensor, delta: torch.Tensor) -> None:
    """``weight += delta`` where ``delta`` is the whole weight's update and ``weight`` may
    be this rank's shard of a DTensor."""
    if isinstance(weight, DTensor):
        delta = distribute_tensor(
            delta.to(weight.dtype).to(weight.device), weight.device_mesh, weight.placements
        )
        weight.add_(delta)
    else:
        weight.add_(delta.to(weight.dtype))
