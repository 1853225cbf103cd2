"""Vision Transformer (ViT) for image classification, with LiBai's hyper-parameter names.

Images are cut into ``patch_size`` x ``patch_size`` patches by a strided convolution, a
learned class token is prepended, learned position embeddings added, and the sequence goes
through pre-norm :class:`~libai.layers.TransformerLayer` blocks (exact GELU, qkv bias), a final
LayerNorm, and a classification head on the class token.

Parallel layout: the patch embedding, class token, position embeddings, final norm and head
are replicated over tensor-parallel ranks (small); the blocks split their heads and MLP over
tp. The embedding lives on pipeline stage 0, norm and head on the last stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import (
    LayerNorm,
    Linear,
    TransformerLayer,
    create_parameter,
    init_method_normal,
    local_value,
)
from libai.layers.param import zeros
from libai.models.utils.hf_kwargs import accepts_hf_keywords


class PatchEmbedding(nn.Module):
    """``Conv2d(in_chans, embed_dim, kernel_size=stride=patch_size)`` then flatten.

    The kernel ``weight`` ``[embed_dim, in_chans, patch, patch]`` and ``bias`` are replicated
    ``[B, B]`` parameters of pipeline stage 0, created with
    :func:`~libai.layers.create_parameter` so their initial value is the same on every layout.
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, init_method):
        super().__init__()
        self.layer_idx, self.patch_size = 0, patch_size
        self.weight = create_parameter(
            (embed_dim, in_chans, patch_size, patch_size), init_method, layer_idx=0
        )
        self.bias = create_parameter((embed_dim,), zeros, layer_idx=0)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[batch, in_chans, H, W]`` -> ``[batch, (H / p) * (W / p), embed_dim]``."""
        # [S(0), B] images x [B, B] kernel -> [S(0), B] patches  (replicated over tp, no comm)
        out = F.conv2d(
            images, local_value(self.weight), local_value(self.bias), stride=self.patch_size
        )
        return out.flatten(2).transpose(1, 2)


class ViTEmbedding(nn.Module):
    """Patch embedding, class token and learned position embeddings, then dropout."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim, drop_rate, init_method):
        super().__init__()
        self.layer_idx = 0
        self.img_size, self.in_chans = img_size, in_chans
        self.num_patches = (img_size // patch_size) ** 2
        self.patch_embed = PatchEmbedding(patch_size, in_chans, embed_dim, init_method)
        self.cls_token = create_parameter((1, 1, embed_dim), init_method, layer_idx=0)
        self.pos_embed = create_parameter(
            (1, self.num_patches + 1, embed_dim), init_method, layer_idx=0
        )
        self.pos_drop = nn.Dropout(drop_rate)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        want = (self.in_chans, self.img_size, self.img_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"VisionTransformer expects images [batch, {want[0]}, {want[1]}, {want[2]}] "
                f"(in_chans={self.in_chans}, img_size={self.img_size}), got "
                f"{list(images.shape)}; resize the images or set model.cfg.img_size."
            )
        x = self.patch_embed(images)
        # [B, B] token and positions, broadcast over the [S(0), B] batch
        cls = local_value(self.cls_token).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + local_value(self.pos_embed)
        return self.pos_drop(x) if self.pos_drop.p > 0 else x  # skip the identity call


class VisionTransformer(nn.Module):
    """ViT classifier (`An Image is Worth 16x16 Words`, arXiv:2010.11929).

    ``model(images)`` returns ``{"logits": [batch, num_classes]}``; with ``labels`` in
    training mode ``{"loss": cross entropy}`` (in eval mode ``{"loss", "logits"}``).

    Args:
        img_size: input side (square images); the image shape is checked.
        patch_size: patch side; the conv kernel size and stride.
        in_chans: image channels.
        embed_dim: hidden size.
        depth: number of Transformer blocks.
        num_heads: attention heads (must be divisible by tensor_parallel_size).
        mlp_ratio: MLP hidden size / ``embed_dim``.
        drop_rate: dropout after the embeddings, the attention output and the MLP.
        attn_drop_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic depth; only 0 is supported.
        num_classes: classes of the head.
        loss_func: ``loss_func(logits, labels)``; ``None`` = mean cross entropy.
        layernorm_epsilon: eps of every LayerNorm (ours; LiBai hard-codes 1e-6).
        qkv_bias: bias on the query / key / value projections (ours).
        activation: MLP activation, ``"gelu"`` (exact) or ``"gelu_tanh"`` (ours).
        initializer_range: std of the normal init (ours).
    """

    #: pipeline contract (libai.runtime.parallel): images into the first stage, labels as
    #: the target of the last stage
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
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        num_classes: int = 1000,
        loss_func=None,
        layernorm_epsilon: float = 1e-6,
        qkv_bias: bool = True,
        activation: str = "gelu",
        initializer_range: float = 0.02,
    ):
        super().__init__()
        tp = dist.get_tensor_parallel_size()
        if num_heads % tp:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by tensor_parallel_size={tp}; use a "
                f"tensor_parallel_size that divides {num_heads}."
            )
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}")
        if drop_path_rate:
            raise NotImplementedError(
                f"drop_path_rate={drop_path_rate}: stochastic depth is not implemented; set 0."
            )
        dist.check_model_num_layers(depth, f"depth={depth}")
        init_method = init_method_normal(initializer_range)
        self.num_layers = depth
        self.embeddings = ViTEmbedding(
            img_size, patch_size, in_chans, embed_dim, drop_rate, init_method
        )
        ffn_hidden_size = int(round(embed_dim * mlp_ratio))
        # a ModuleDict keyed by layer index: a pipeline stage drops the others, names stay
        self.blocks = nn.ModuleDict(
            {
                str(i): TransformerLayer(
                    embed_dim,
                    ffn_hidden_size,
                    num_heads,
                    attention_dropout_prob=attn_drop_rate,
                    output_dropout_prob=drop_rate,
                    layernorm_epsilon=layernorm_epsilon,
                    activation=activation,
                    qkv_bias=qkv_bias,
                    init_method=init_method,
                    layer_idx=i,
                )
                for i in range(depth)
            }
        )
        self.norm = LayerNorm(embed_dim, eps=layernorm_epsilon, layer_idx=-1)
        # [S(0), B] x [B, B]^T -> [S(0), B]: a small replicated head, full logits everywhere
        self.head = Linear(embed_dim, num_classes, True, "data", init_method, layer_idx=-1)
        self.loss_func = nn.CrossEntropyLoss() if loss_func is None else loss_func

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (or a previous stage's hidden states) -> this stage's hidden states,
        normalized by the final LayerNorm on the last stage."""
        if self.embeddings is not None:
            x = self.embeddings(x)
        for block in self.blocks.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        return x

    def pipeline_forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pipeline stage: images or hidden states in; hidden states or logits out."""
        x = self.forward_features(x)
        if self.head is not None:
            x = self.head(x[:, 0])  # the class token
        return x

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_func(logits.float(), labels)

    @accepts_hf_keywords
    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        """Args:
        images: ``[batch, in_chans, img_size, img_size]`` float.
        labels: ``[batch]`` class ids (optional).
        """
        logits = self.pipeline_forward(images)
        if labels is None:
            return {"logits": logits}
        out = {"loss": self.pipeline_loss(logits, labels)}
        if not self.training:
            out["logits"] = logits
        return out
