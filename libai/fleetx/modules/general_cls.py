"""FleetX's ViT image classification as a task module: ``Model.module: GeneralClsModule``
(FleetX's ``ppfleetx/configs/vis/vit/*.yaml``) on the zoo's VisionTransformer."""

from __future__ import annotations

import logging
import re

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import ZooModule
from libai.models import VisionTransformer

logger = logging.getLogger(__name__)

__all__ = ["GeneralClsModule", "vit_celoss", "vit_kwargs"]

#: FleetX's ViT names: size -> (embed_dim, depth, num_heads)
VIT_SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}
#: FleetX ViT argument -> VisionTransformer argument (the others keep their names)
RENAMED = {"class_num": "num_classes", "epsilon": "layernorm_epsilon"}


def vit_kwargs(model: dict) -> dict:
    """VisionTransformer's arguments from FleetX's ``Model.model`` (``name:
    ViT_<size>_patch<p>_<img>`` and overrides such as ``class_num``, ``drop_rate``,
    ``depth``)."""
    model = dict(model)
    name = str(model.pop("name", ""))
    found = re.fullmatch(r"ViT_(\w+?)_patch(\d+)_(\d+)", name)
    if not found or found.group(1) not in VIT_SIZES:
        raise ValueError(
            f"Model.model.name={name!r}: expected ViT_<size>_patch<p>_<image size> with size "
            f"one of {', '.join(VIT_SIZES)} (e.g. ViT_base_patch16_224)"
        )
    embed, depth, heads = VIT_SIZES[found.group(1)]
    kwargs = {
        "embed_dim": embed,
        "depth": depth,
        "num_heads": heads,
        "patch_size": int(found.group(2)),
        "img_size": int(found.group(3)),
    }
    for key, value in model.items():
        kwargs[RENAMED.get(key, key)] = value
    return kwargs


def vit_celoss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float | None) -> torch.Tensor:
    """FleetX's ``ViTCELoss``: per-class sigmoid cross entropy against one-hot labels (ViT's
    smoothing ``label × (1 - ε) + ε``), summed over classes, averaged over the batch."""
    target = F.one_hot(labels.long(), logits.shape[-1]).float()
    if epsilon is not None:
        target = target * (1.0 - epsilon) + epsilon
    loss = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    return loss.sum(-1).mean()


def _ce_loss(logits, labels, epsilon):
    """FleetX's ``CELoss`` (softmax cross entropy, label smoothing ``ε`` when set)."""
    return F.cross_entropy(logits.float(), labels.long(), label_smoothing=float(epsilon or 0.0))


LOSSES = {"ViTCELoss": vit_celoss, "CELoss": _ce_loss}


class GeneralClsModule(ZooModule):
    """FleetX's ``GeneralClsModule`` with a ViT (``Model.model.name: ViT_*``): training loss
    ``Model.loss.train`` (``ViTCELoss`` or ``CELoss``, with ``epsilon``), evaluation loss
    ``Model.loss.eval`` and ``TopkAcc`` (``topk``: reported as ``top1``, ``top5``, ...).
    Data: FleetX's ``GeneralClsDataset`` (an image list and PaddleClas' ``transform_ops``).
    Tensor / pipeline parallel: no (the module computes its own loss); data parallel and
    sharding: yes."""

    model_class = VisionTransformer
    module_keys = ("model", "loss", "metric")
    libai_model = False

    def process_configs(self, configs):
        model = OmegaConf.to_container(configs.Model, resolve=True)
        if not isinstance(model.get("model"), dict):
            raise ValueError("GeneralClsModule needs Model.model: {name: ViT_..., class_num: ...}")
        self.losses = {}
        for split in ("train", "eval"):
            spec = dict((model.get("loss") or {}).get(split) or {"name": "CELoss"})
            name = spec.pop("name")
            if name not in LOSSES:
                raise ValueError(f"Model.loss.{split}.name={name!r}: one of {', '.join(LOSSES)}")
            self.losses[split] = (LOSSES[name], spec.get("epsilon"))
        metric = dict((model.get("metric") or {}).get("eval") or {"name": "TopkAcc"})
        if metric.get("name") != "TopkAcc":
            raise ValueError(f"Model.metric.eval.name={metric.get('name')!r}: only TopkAcc")
        topk = metric.get("topk", [1, 5])
        self.topk = [int(k) for k in ([topk] if isinstance(topk, int) else topk)]
        self.vit = vit_kwargs(model["model"])
        return configs

    def get_model(self):
        return VisionTransformer(**self.vit)

    def _loss(self, split, batch):
        fn, epsilon = self.losses[split]
        logits = self.model(batch["images"])["logits"]
        return logits, fn(logits, batch["labels"], epsilon)

    def training_step(self, batch):
        return self._loss("train", batch)[1]

    def validation_step(self, batch):
        logits, loss = self._loss("eval", batch)
        labels = batch["labels"].long()
        out = {"loss": loss, "count": labels.numel()}
        ranked = logits.topk(min(max(self.topk), logits.shape[-1]), dim=-1).indices
        for k in self.topk:
            out[f"top{k}_correct"] = (ranked[:, :k] == labels[:, None]).any(-1).sum()
        return out

    def validation_epoch_end(self, log_dict):
        sums = log_dict.get("sums") or {}
        if not sums.get("count"):
            return None
        return {f"top{k}": sums[f"top{k}_correct"] / sums["count"] for k in self.topk}

    def input_spec(self):
        size, chans = self.model.embeddings.img_size, self.model.embeddings.in_chans
        return [InputSpec([None, chans, size, size], "float32", "images")]
