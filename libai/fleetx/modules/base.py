"""What the zoo's task modules share: ``Model`` keys checked against the model's
hyper-parameters, FleetX's aliases, and loading Hugging Face weights."""

from __future__ import annotations

import difflib
import inspect

from omegaconf import OmegaConf

from libai.fleetx.module import BasicModule, call_with_batch
from libai.models.contract import total_loss

__all__ = ["AccuracyModule", "ZooModule", "tokenizer_from"]

#: ``Model`` keys that configure the module or the run, not the model's constructor
#: (FleetX's switches: libai.fleetx.fleetx_keys says what each does here)
MODULE_KEYS = (
    "module",
    "use_recompute",
    "recompute_granularity",
    "no_recompute_layers",
    "pretrained",
    "tokenizer",
    "name",
    "sequence_parallel",
    "virtual_pp_degree",
    "vocab_size_divisible_unit",
    "fused_linear",
    "fuse_attn_qkv",
    "use_flash_attn",
    "fused_softmax_with_triangular",
    "scale_qk_by_layer_num",
    "type_vocab_size",
)


def _parameters(cls) -> set[str]:
    init = inspect.unwrap(cls.__init__)
    return {n for n in inspect.signature(init).parameters if n not in ("self", "cfg")}


class ZooModule(BasicModule):
    """A task module around a libai zoo model.

    Subclasses set ``model_class`` (the class built), ``config_class`` (whose ``__init__``
    lists the hyper-parameters; default ``model_class``), ``head_keys`` (head options the
    model takes besides them), ``aliases`` (FleetX / transformers name -> libai name(s)) and
    ``defaults``. ``Model.pretrained: DIR`` loads a Hugging Face directory into the model
    (with the other keys as overrides).
    """

    libai_model = True
    model_class: type
    config_class: type | None = None
    head_keys: tuple[str, ...] = ()
    aliases: dict[str, str | tuple[str, ...]] = {}
    defaults: dict = {}
    #: more ``Model`` keys that configure the subclass, not the model's constructor
    module_keys: tuple[str, ...] = ()

    def model_kwargs(self) -> dict:
        """The model's hyper-parameters from ``Model`` (aliases applied, keys checked)."""
        model_cfg = OmegaConf.to_container(self.cfg.Model, resolve=True)
        known = _parameters(self.config_class or self.model_class) | set(self.head_keys)
        kwargs = dict(self.defaults)
        for key, value in model_cfg.items():
            if key in MODULE_KEYS or key in self.module_keys:
                continue
            targets = self.aliases.get(key, key)
            for target in (targets,) if isinstance(targets, str) else targets:
                if target not in known:
                    close = difflib.get_close_matches(target, sorted(known), n=3, cutoff=0.5)
                    hint = (
                        f"; did you mean {' or '.join(f'Model.{c}' for c in close)}?"
                        if close
                        else ""
                    )
                    raise ValueError(
                        f"unknown config key Model.{key}{hint} ({type(self).__name__} builds "
                        f"{self.model_class.__name__}, which takes: {', '.join(sorted(known))})"
                    )
                kwargs[target] = value
        return kwargs

    def get_model(self):
        kwargs = self.model_kwargs()
        pretrained = self.cfg.Model.get("pretrained")
        if pretrained:
            from libai.models.utils import load_huggingface

            return load_huggingface(str(pretrained), self.model_class, **kwargs)
        return self.model_class(**kwargs)


class AccuracyModule(ZooModule):
    """A classifier: evaluation reports accuracy besides the loss (the model returns
    ``{"loss", "logits"}`` in eval mode with labels). Under pipeline parallelism the
    evaluation gives the loss only."""

    def validation_step(self, batch):
        out = call_with_batch(self, batch)
        logits, labels = out["logits"], batch["labels"]
        loss = total_loss(out)
        correct = (logits.argmax(dim=-1) == labels).sum() if logits.dim() > 1 else 0
        return {"loss": loss, "correct": correct, "count": labels.numel()}

    def validation_epoch_end(self, log_dict):
        sums = log_dict.get("sums") or {}
        if not sums.get("count"):
            return None
        return {"acc": sums["correct"] / sums["count"]}


def tokenizer_from(spec, fallback_dir=None, key="Model.tokenizer"):
    """A libai tokenizer from ``spec``: a Hugging Face model / tokenizer directory or a
    ``tokenizer.json`` path; ``None`` uses ``fallback_dir`` (``Model.pretrained``)."""
    import os

    from libai.inference.tokenizer_loading import load_tokenizer
    from libai.tokenizer import JsonTokenizer

    path = spec or fallback_dir
    if path is None:
        raise ValueError(
            f"{key} is required (a tokenizer directory or a tokenizer.json) when "
            "Model.pretrained is not set"
        )
    path = str(path)
    if os.path.isfile(path):
        return JsonTokenizer(path)
    config = os.path.join(path, "config.json")
    hf_config = None
    if os.path.isfile(config):
        from libai.models.utils import read_hf_config

        hf_config = read_hf_config(path)
    return load_tokenizer(path, hf_config)
