"""Swin Transformer v1 and v2 image classifiers, with LiBai's hyper-parameter names.

``SwinTransformer`` (`Swin Transformer: Hierarchical Vision Transformer using Shifted
Windows`, arXiv:2103.14030) and ``SwinTransformerV2`` (`Swin Transformer V2: Scaling Up
Capacity and Resolution`, arXiv:2111.09883) take exactly the keys of LiBai's config files
(``configs/common/models/swin*/``) and build from :mod:`libai.models.swin_layers`, one
implementation of both versions.

Output contract (LiBai's keys): ``{"losses": loss}`` with labels in training mode;
``{"prediction_scores": logits}`` otherwise, the same tensor also under ``"logits"`` (the
key this library's evaluators and tools read), plus ``"losses"`` when labels are given in
eval mode.

Parallel layout: each block's MLP is column / row parallel over tp, everything else is
replicated (as in LiBai). Pipeline stages cut between blocks: block ``i`` (counted over all
stages of the network) is pipeline layer ``i``, so ``train.dist.pipeline_num_layers =
sum(depths)`` as LiBai's configs set it; a patch merging belongs to the last block before it,
the patch embedding to layer 0, the final norm and head to the last layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import LayerNorm, Linear, local_value
from libai.models.swin_layers import PatchMerging, SwinBlock, SwinPatchEmbed, trunc_normal
from libai.models.utils.hf_kwargs import accepts_hf_keywords

__all__ = ["SwinTransformer", "SwinTransformerV2"]


class SwinStage(nn.Module):
    """The blocks of one resolution (a ``ModuleDict`` keyed by their global layer index, so a
    pipeline stage drops the others and names stay) and the patch merging after them."""

    def __init__(self, blocks: dict[str, SwinBlock], downsample: PatchMerging | None):
        super().__init__()
        self.blocks = nn.ModuleDict(blocks)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class _Features(nn.Identity):
    """``num_classes=0``: no head, the pooled features are the scores (as in LiBai)."""

    layer_idx = -1


class SwinClassifier(nn.Module):
    """What both versions share: patch embedding, stages, pooled norm, head, loss."""

    #: pipeline contract (libai.runtime.parallel): images into the first stage, labels as
    #: the target of the last stage
    pipeline_input_key = "images"
    pipeline_target_key = "labels"
    #: the blocks activation checkpointing / compile / ZeRO-3 wrap (libai.runtime.blocks)
    _no_split_modules = ("SwinBlock",)

    def _build(
        self,
        *,
        cosine: bool,
        img_size: int,
        patch_size: int,
        in_chans: int,
        num_classes: int,
        embed_dim: int,
        depths: Sequence[int],
        num_heads: Sequence[int],
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        qk_scale: float | None,
        drop_rate: float,
        attn_drop_rate: float,
        drop_path_rate: float,
        ape: bool,
        patch_norm: bool,
        pretrained_window_sizes: Sequence[int] | None,
        loss_func,
        layernorm_epsilon: float,
    ) -> None:
        depths, num_heads = [int(d) for d in depths], [int(h) for h in num_heads]
        pretrained = [int(p) for p in pretrained_window_sizes or [0] * len(depths)]
        _check(depths, num_heads, pretrained, embed_dim, mlp_ratio)
        total = sum(depths)
        dist.check_model_num_layers(total, f"sum(depths)={total}")
        self.num_layers, self.num_classes = total, num_classes
        self.patch_embed = SwinPatchEmbed(
            img_size,
            patch_size,
            in_chans,
            embed_dim,
            patch_norm,
            ape,
            drop_rate,
        )
        # stochastic depth grows linearly over the blocks, 0 -> drop_path_rate
        rates = torch.linspace(0, drop_path_rate, total).tolist() if total else []
        stages, layer, (h, w) = [], 0, self.patch_embed.resolution
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            dim = embed_dim * 2**i
            blocks = {
                str(layer + j): SwinBlock(
                    dim,
                    (h, w),
                    heads,
                    window_size,
                    0 if j % 2 == 0 else window_size // 2,
                    mlp_ratio,
                    qkv_bias,
                    drop_rate,
                    attn_drop_rate,
                    rates[layer + j],
                    cosine=cosine,
                    qk_scale=qk_scale,
                    pretrained_window=pretrained[i],
                    layernorm_epsilon=layernorm_epsilon,
                    layer_idx=layer + j,
                )
                for j in range(depth)
            }
            layer += depth
            merge = None
            if i < len(depths) - 1:
                merge = PatchMerging((h, w), dim, cosine, layer_idx=layer - 1)
                h, w = h // 2, w // 2
            stages.append(SwinStage(blocks, merge))
        self.layers = nn.ModuleList(stages)
        self.num_features = embed_dim * 2 ** (len(depths) - 1)
        self.norm = LayerNorm(self.num_features, eps=layernorm_epsilon, layer_idx=-1)
        # [S(0), B] x [B, B]^T -> [S(0), B]: a small replicated head, full logits everywhere
        self.head = (
            Linear(self.num_features, num_classes, True, "data", trunc_normal, layer_idx=-1)
            if num_classes > 0
            else _Features()
        )
        self.loss_func = nn.CrossEntropyLoss() if loss_func is None else loss_func
        if cosine:  # v2 starts every residual branch at zero (LiBai's _init_respostnorm)
            with torch.no_grad():
                for stage in self.layers:
                    for block in stage.blocks.values():
                        for norm in (block.norm1, block.norm2):
                            local_value(norm.weight).zero_()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (or a previous stage's hidden states) -> this stage's hidden states; on
        the last stage the normalized features averaged over the tokens ``[batch, C]``."""
        if self.patch_embed is not None:
            x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        if self.norm is not None:
            x = self.norm(x).mean(dim=1)
        return x

    def pipeline_forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pipeline stage: images or hidden states in; hidden states or logits out."""
        x = self.forward_features(x)
        return self.head(x) if self.head is not None else x

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``loss_func(logits, labels)``; in eval mode on class ids, cross entropy: LiBai
        computes no evaluation loss, and its configs' ``SoftTargetCrossEntropy`` needs the
        soft targets only the training loader's mixup makes."""
        logits = logits.float()
        if self.training or labels.is_floating_point():
            return self.loss_func(logits, labels)
        return F.cross_entropy(logits, labels)

    @accepts_hf_keywords
    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        """Args:
        images: ``[batch, in_chans, img_size, img_size]`` float.
        labels: ``[batch]`` class ids, or ``[batch, num_classes]`` soft targets (mixup).
        """
        logits = self.pipeline_forward(images)
        if labels is not None and self.training:
            return {"losses": self.pipeline_loss(logits, labels)}
        out = {"prediction_scores": logits, "logits": logits}
        if labels is not None:
            out["losses"] = self.pipeline_loss(logits, labels)
        return out


def _check(depths, num_heads, pretrained, embed_dim, mlp_ratio) -> None:
    """One-line errors naming the key, before anything is built."""
    if len(num_heads) != len(depths):
        raise ValueError(
            f"Swin: num_heads={num_heads} needs one entry per stage of depths={depths}"
        )
    # LiBai reads one entry per stage: more are accepted when they are 0 (the default's 4
    # entries under a config that has fewer stages)
    if len(pretrained) < len(depths) or any(pretrained[len(depths) :]):
        raise ValueError(
            f"Swin: pretrained_window_sizes={pretrained} needs one entry per stage of "
            f"depths={depths}"
        )
    tp = dist.get_tensor_parallel_size()
    for i in range(len(depths)):
        hidden = int(embed_dim * 2**i * mlp_ratio)
        if hidden % tp:
            raise ValueError(
                f"Swin: the MLP of stage {i} has {hidden} = embed_dim * 2**{i} * mlp_ratio "
                f"channels, not divisible by tensor_parallel_size={tp}; change embed_dim / "
                "mlp_ratio or the tensor_parallel_size"
            )


class SwinTransformer(SwinClassifier):
    """Swin Transformer (v1) classifier; LiBai's keys.

    Args:
        img_size: input side (square images); the image shape is checked.
        patch_size: patch side (conv kernel and stride).
        in_chans: image channels.
        num_classes: classes of the head (0: no head, the pooled features are returned).
        embed_dim: channels of the first stage; doubled by every patch merging.
        depths: blocks per stage.
        num_heads: attention heads per stage.
        window_size: attention window side; a stage whose map is not larger uses the map.
        mlp_ratio: MLP hidden size / channels.
        qkv_bias: bias on the query / key / value projection.
        qk_scale: attention score scale (``None``: ``head_dim ** -0.5``).
        drop_rate: dropout after the embeddings, attention output and MLP.
        attn_drop_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic depth of the last block (linear from 0 over the blocks).
        ape: learned absolute position embedding added to the patches.
        patch_norm: LayerNorm after the patch embedding.
        loss_func: ``loss_func(logits, labels)`` in training; ``None`` = cross entropy.
        layernorm_epsilon: eps of the blocks' and the final LayerNorm (ours; the patch
            embedding's and patch merging's keep 1e-5, as in LiBai and transformers).
    """

    @configurable
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        ape: bool = False,
        patch_norm: bool = True,
        loss_func=None,
        layernorm_epsilon: float = 1e-5,
    ):
        super().__init__()
        self._build(  # every argument above, by name
            cosine=False,
            pretrained_window_sizes=None,
            **{k: v for k, v in locals().items() if k not in ("self", "__class__")},
        )


class SwinTransformerV2(SwinClassifier):
    """Swin Transformer V2 classifier; LiBai's keys.

    The arguments are :class:`SwinTransformer`'s without ``qk_scale`` (scaled cosine
    attention has a learned per-head scale), plus:

    Args:
        pretrained_window_sizes: per stage, the window size the continuous position bias was
            pre-trained with (0: the stage's own window), which scales the coordinates its
            MLP sees so a model fine-tunes at a larger window. ``None``: all 0.
    """

    @configurable
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        ape: bool = False,
        patch_norm: bool = True,
        pretrained_window_sizes: Sequence[int] | None = None,
        loss_func=None,
        layernorm_epsilon: float = 1e-5,
    ):
        super().__init__()
        self._build(  # every argument above, by name
            cosine=True,
            qk_scale=None,
            **{k: v for k, v in locals().items() if k not in ("self", "__class__")},
        )
