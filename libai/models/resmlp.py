"""ResMLP (`ResMLP: Feedforward networks for image classification with data-efficient
training`, arXiv:2105.03404) with LiBai's hyper-parameter names.

Patches (the strided convolution of :class:`~libai.models.vit.PatchEmbedding`) go through
``depth`` residual blocks, each::

    x = x + gamma_1 * CrossPatch(Aff_1(x))      # Linear over the patch axis, per channel
    x = x + gamma_2 * MLP(Aff_2(x))             # per patch: Linear -> GELU -> Linear

with ``Aff(x) = alpha * x + beta`` (per channel) and the layer-scale vectors ``gamma``
(initialised to ``init_scale``); then a final affine, the mean over patches and a linear
classifier.

Parallel layout: the cross-channel MLP splits its hidden units over tensor-parallel ranks
(column- then row-parallel, as LiBai's ``MLP``); the cross-patch linear, the affines, the
layer scales, the patch embedding and the head are replicated over tp (small). The patch
embedding lives on pipeline stage 0, the final affine and head on the last stage.
"""

from __future__ import annotations

import torch
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import MLP, DropPath, Linear, create_parameter, local_value
from libai.layers.param import ones, zeros
from libai.models.utils.hf_kwargs import accepts_hf_keywords
from libai.models.vit import PatchEmbedding

__all__ = ["Affine", "ResMLP", "ResMLPBlock"]


def trunc_normal_init(std: float = 0.02):
    """Truncated normal init at ``[-2, 2]`` (absolute, as timm's ``trunc_normal_``)."""

    def init(tensor: torch.Tensor, generator=None) -> torch.Tensor:
        return nn.init.trunc_normal_(tensor, std=std, a=-2.0, b=2.0, generator=generator)

    return init


def _constant(value: float):
    def init(tensor: torch.Tensor, generator=None) -> torch.Tensor:
        return nn.init.constant_(tensor, value)

    return init


class Affine(nn.Module):
    """``alpha * x + beta`` per channel (ResMLP's normalisation), ``[B, B]`` parameters."""

    def __init__(self, dim: int, *, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.alpha = create_parameter((dim,), ones, layer_idx=layer_idx)
        self.beta = create_parameter((dim,), zeros, layer_idx=layer_idx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [S(0), B] x [B, B] -> [S(0), B]
        return local_value(self.alpha) * x + local_value(self.beta)


class ResMLPBlock(nn.Module):
    """One residual block: cross-patch linear, then the cross-channel MLP, each behind an
    affine and scaled by ``gamma`` (LiBai's ``layers_scale_mlp_blocks``)."""

    def __init__(
        self,
        dim: int,
        num_patches: int,
        drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float = 1e-4,
        init_method=None,
        *,
        layer_idx: int = 0,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        init_method = init_method or trunc_normal_init()
        self.norm1 = Affine(dim, layer_idx=layer_idx)
        # over the patch axis: [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.attn = Linear(num_patches, num_patches, True, "data", init_method, layer_idx=layer_idx)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = Affine(dim, layer_idx=layer_idx)
        # [S(0), B] -> col [S(0), S(-1)] -> row [S(0), P] -> all-reduce -> [S(0), B]
        self.mlp = MLP(dim, 4 * dim, drop, "gelu", init_method=init_method, layer_idx=layer_idx)
        scale = _constant(init_values)
        self.gamma_1 = create_parameter((dim,), scale, layer_idx=layer_idx)
        self.gamma_2 = create_parameter((dim,), scale, layer_idx=layer_idx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.attn(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.drop_path(local_value(self.gamma_1) * mixed)
        return x + self.drop_path(local_value(self.gamma_2) * self.mlp(self.norm2(x)))


class ResMLP(nn.Module):
    """ResMLP classifier (LiBai's ``ResMLP``).

    ``model(images)`` returns ``{"logits": [batch, num_classes]}``; with ``labels`` in
    training mode ``{"loss": loss_func(logits, labels)}`` (in eval mode ``{"loss",
    "logits"}``).

    Args:
        img_size: input side (square images); the image shape is checked.
        patch_size: patch side.
        in_chans: image channels.
        embed_dim: channels per patch.
        depth: number of blocks.
        drop_rate: dropout after the MLP.
        drop_path_rate: stochastic depth of every block (the same rate for all, as LiBai).
        init_scale: initial value of the layer-scale vectors.
        num_classes: classes of the head.
        loss_func: ``loss_func(logits, labels)``; ``None`` = mean cross entropy.
    """

    pipeline_input_key = "images"
    pipeline_target_key = "labels"

    @configurable
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        init_scale: float = 1e-4,
        num_classes: int = 1000,
        loss_func=None,
    ):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}")
        tp = dist.get_tensor_parallel_size()
        if (4 * embed_dim) % tp:
            raise ValueError(
                f"ResMLP: the MLP's 4 * embed_dim = {4 * embed_dim} is not divisible by "
                f"tensor_parallel_size={tp}"
            )
        dist.check_model_num_layers(depth, f"depth={depth}")
        self.img_size, self.in_chans, self.num_layers = img_size, in_chans, depth
        self.num_classes = num_classes
        init_method = trunc_normal_init(0.02)
        self.patch_embed = PatchEmbedding(patch_size, in_chans, embed_dim, init_method)
        num_patches = (img_size // patch_size) ** 2
        # a ModuleDict keyed by layer index: a pipeline stage drops the others, names stay
        self.blocks = nn.ModuleDict(
            {
                str(i): ResMLPBlock(
                    embed_dim,
                    num_patches,
                    drop_rate,
                    drop_path_rate,
                    init_scale,
                    init_method,
                    layer_idx=i,
                )
                for i in range(depth)
            }
        )
        self.norm = Affine(embed_dim, layer_idx=-1)
        # [S(0), B] x [B, B]^T -> [S(0), B]
        self.head = Linear(embed_dim, num_classes, True, "data", init_method, layer_idx=-1)
        self.loss_func = nn.CrossEntropyLoss() if loss_func is None else loss_func

    def _check_images(self, images: torch.Tensor) -> None:
        want = (self.in_chans, self.img_size, self.img_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"ResMLP expects images [batch, {want[0]}, {want[1]}, {want[2]}] (in_chans="
                f"{self.in_chans}, img_size={self.img_size}), got {list(images.shape)}; resize "
                "the images or set model.cfg.img_size."
            )

    def pipeline_forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pipeline stage: images or hidden states in; hidden states or logits out."""
        if self.patch_embed is not None:
            self._check_images(x)
            x = self.patch_embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x).mean(dim=1))
        return x

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_func(logits.float(), labels)

    @accepts_hf_keywords
    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        """Args:
        images: ``[batch, in_chans, img_size, img_size]`` float.
        labels: ``[batch]`` class ids, or ``[batch, num_classes]`` soft targets (Mixup).
        """
        logits = self.pipeline_forward(images)
        if labels is None:
            return {"logits": logits}
        out = {"loss": self.pipeline_loss(logits, labels)}
        if not self.training:
            out["logits"] = logits
        return out
