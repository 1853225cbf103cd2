"""The pieces of Swin Transformer v1 and v2: window attention, the block, patch merging and
the patch embedding. One implementation serves both versions; v2 differs by switches:

=====================  =====================================  ================================
                       v1 (``cosine=False``)                  v2 (``cosine=True``)
=====================  =====================================  ================================
attention scores       ``(q * head_dim^-0.5) k^T``            ``cos(q, k) * exp(logit_scale)``
relative position      a learned table ``[(2W-1)^2, heads]``  ``16 * sigmoid(cpb_mlp(log
bias                                                          coords))``, coords scaled by
                                                              the pretrained window size
qkv bias               one bias on q, k and v                 ``q_bias`` and ``v_bias``, none
                                                              on k
residuals              pre-norm ``x + f(norm(x))``            post-norm ``x + norm(f(x))``
patch merging          ``norm(4C)`` then ``reduction``        ``reduction`` then ``norm(2C)``
=====================  =====================================  ================================

Parallel layout (LiBai's): the MLP of every block is column / row parallel over tp; the
window attention, patch merging, patch embedding and their tables are replicated (small;
LiBai's Swin keeps them whole, so any head count runs on any tp).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers import MLP, DropPath, LayerNorm, Linear, create_parameter, local_value
from libai.layers.param import zeros
from libai.models.vit import PatchEmbedding

__all__ = [
    "PatchMerging",
    "SwinBlock",
    "SwinPatchEmbed",
    "WindowAttention",
    "shifted_window_mask",
    "trunc_normal",
    "window_partition",
    "window_reverse",
]


def trunc_normal(tensor, generator=None):
    """Truncated N(0, 0.02) (LiBai's and timm's init of Swin's linear layers and tables)."""
    return nn.init.trunc_normal_(tensor, std=0.02, generator=generator)


def _log_ten(tensor, generator=None):
    """v2's initial logit scale: ``log(10)``, a temperature of 10 on the cosines."""
    return nn.init.constant_(tensor, math.log(10.0))


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """``[B, H, W, C]`` -> ``[B * (H / window) * (W / window), window * window, C]``, the
    windows of each image in row-major order."""
    b, h, w, c = x.shape
    x = x.view(b, h // window, window, w // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, c)


def window_reverse(windows: torch.Tensor, window: int, h: int, w: int) -> torch.Tensor:
    """The inverse of :func:`window_partition`: ``[B * nW, window * window, C]`` -> ``[B, H,
    W, C]``."""
    c = windows.shape[-1]
    x = windows.view(-1, h // window, w // window, window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, c)


def shifted_window_mask(h: int, w: int, window: int, shift: int) -> torch.Tensor:
    """``[nW, window^2, window^2]``: 0 between tokens of the same region of the cyclically
    shifted map, -100 across regions (each axis has three regions: ``[0, size - window)``,
    ``[size - window, size - shift)``, ``[size - shift, size)``)."""
    rows = (torch.arange(h) >= h - window).long() + (torch.arange(h) >= h - shift).long()
    cols = (torch.arange(w) >= w - window).long() + (torch.arange(w) >= w - shift).long()
    region = (rows[:, None] * 3 + cols[None, :]).float()[None, :, :, None]
    windows = window_partition(region, window).squeeze(-1)  # [nW, window^2]
    diff = windows.unsqueeze(1) - windows.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill(diff != 0, -100.0)


def relative_position_index(window: int) -> torch.Tensor:
    """``[window^2, window^2]``: the row of the relative-position table for each pair of
    tokens of a window, ``(dh + window - 1) * (2 * window - 1) + (dw + window - 1)``."""
    coords = torch.stack(
        torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    ).flatten(1)  # [2, window^2]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


def log_spaced_coords(window: int, pretrained_window: int) -> torch.Tensor:
    """``[(2W-1)^2, 2]``: v2's relative coordinates ``(dh, dw)`` divided by ``pretrained_window
    - 1`` (``window - 1`` when it is 0), times 8, then ``sign(x) * log2(1 + |x|) / 3``."""
    span = torch.arange(-(window - 1), window, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(span, span, indexing="ij"), dim=-1).reshape(-1, 2)
    norm = pretrained_window if pretrained_window > 0 else window
    if norm > 1:
        table = table / (norm - 1)
    table = table * 8
    return torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside each window, with a relative position bias (v1's
    table or v2's continuous bias), optionally masked across shifted-window regions.

    Args:
        dim: channels; ``num_heads`` must divide it.
        num_heads: heads.
        window: window side (the module's table is sized for it).
        qkv_bias: biases on the q / k / v projection (v2: on q and v only).
        attn_drop: dropout on the attention probabilities.
        proj_drop: dropout after the output projection.
        cosine: v2's scaled cosine attention and continuous position bias.
        qk_scale: v1's score scale (``None``: ``head_dim ** -0.5``).
        pretrained_window: v2's window of pre-training (0: ``window``), scales the
            coordinates the bias MLP sees.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        cosine: bool = False,
        qk_scale: float | None = None,
        pretrained_window: int = 0,
        layer_idx: int = 0,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Swin: channels {dim} are not divisible by num_heads={num_heads}")
        self.num_heads, self.window, self.cosine = num_heads, window, cosine
        self.scale = 1.0 if cosine else (qk_scale or (dim // num_heads) ** -0.5)
        self.attn_drop, self.layer_idx = attn_drop, layer_idx
        device = dist.capture_mesh().device
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated over tp, as in LiBai)
        self.qkv = Linear(
            dim, 3 * dim, qkv_bias and not cosine, "data", trunc_normal, layer_idx=layer_idx
        )
        self.q_bias = self.v_bias = None
        if cosine and qkv_bias:
            self.q_bias = create_parameter((dim,), zeros, layer_idx=layer_idx)
            self.v_bias = create_parameter((dim,), zeros, layer_idx=layer_idx)
        if cosine:
            self.logit_scale = create_parameter((num_heads, 1, 1), _log_ten, layer_idx=layer_idx)
            # the continuous position bias: (dh, dw) -> one bias per head
            self.cpb_mlp = nn.Sequential(
                Linear(2, 512, True, "data", trunc_normal, layer_idx=layer_idx),
                nn.ReLU(),
                Linear(512, num_heads, False, "data", trunc_normal, layer_idx=layer_idx),
            )
            coords = log_spaced_coords(window, pretrained_window).to(device)
            self.register_buffer("relative_coords_table", coords, persistent=False)
        else:
            self.relative_position_bias_table = create_parameter(
                ((2 * window - 1) ** 2, num_heads), trunc_normal, layer_idx=layer_idx
            )
        index = relative_position_index(window).to(device)
        self.register_buffer("relative_position_index", index, persistent=False)
        self.proj = Linear(dim, dim, True, "data", trunc_normal, layer_idx=layer_idx)
        self.proj_drop = nn.Dropout(proj_drop)

    def position_bias(self) -> torch.Tensor:
        """``[heads, window^2, window^2]``, the bias added to every window's scores."""
        if self.cosine:
            table = 16 * torch.sigmoid(self.cpb_mlp(self.relative_coords_table))
        else:
            table = local_value(self.relative_position_bias_table)
        n = self.window * self.window
        return table[self.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: ``[B * nW, window^2, C]``; ``mask``: ``[nW, window^2, window^2]`` or None."""
        windows, n, c = x.shape
        qkv = self.qkv(x)
        if self.q_bias is not None:
            v_bias = local_value(self.v_bias)
            qkv = qkv + torch.cat([local_value(self.q_bias), torch.zeros_like(v_bias), v_bias])
        # [B * nW, N, 3C] -> 3 x [B * nW, heads, N, head_dim]
        q, k, v = qkv.view(windows, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        if self.cosine:
            logit_scale = local_value(self.logit_scale).clamp(max=math.log(100.0)).exp()
            q, k = F.normalize(q, dim=-1) * logit_scale, F.normalize(k, dim=-1)
        bias = self.position_bias().unsqueeze(0).to(q.dtype)  # [1, heads, N, N]
        if mask is not None:
            # window w of image b is row b * nW + w: the mask repeats over the images
            per_window = bias + mask.unsqueeze(1).to(q.dtype)  # [nW, heads, N, N]
            bias = per_window.repeat(windows // mask.shape[0], 1, 1, 1)
        drop = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, bias, dropout_p=drop, scale=self.scale)
        out = self.proj(out.transpose(1, 2).reshape(windows, n, c))
        return self.proj_drop(out) if self.proj_drop.p > 0 else out


class SwinBlock(nn.Module):
    """(Shifted-)window attention and an MLP, each in a residual branch with stochastic depth.

    A window as large as the feature map (``min(resolution) <= window``) becomes the whole
    map, unshifted (as LiBai and transformers do). ``post_norm`` is v2's residual
    ``x + norm(f(x))``; otherwise ``x + f(norm(x))``.
    """

    def __init__(
        self,
        dim: int,
        resolution: tuple[int, int],
        num_heads: int,
        window: int,
        shift: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop: float,
        attn_drop: float,
        drop_path: float,
        *,
        cosine: bool,
        qk_scale: float | None,
        pretrained_window: int,
        layernorm_epsilon: float,
        layer_idx: int,
    ):
        super().__init__()
        if min(resolution) <= window:
            window, shift = min(resolution), 0
        if any(r % window for r in resolution):
            raise ValueError(
                f"Swin: feature map {resolution[0]}x{resolution[1]} (layer {layer_idx}) is not "
                f"divisible by window_size={window}; choose img_size / patch_size / window_size "
                "so that every stage's map is a multiple of the window"
            )
        self.resolution, self.window, self.shift = tuple(resolution), window, shift
        self.post_norm, self.layer_idx = cosine, layer_idx
        self.norm1 = LayerNorm(dim, eps=layernorm_epsilon, layer_idx=layer_idx)
        self.attn = WindowAttention(
            dim,
            num_heads,
            window,
            qkv_bias,
            attn_drop,
            drop,
            cosine=cosine,
            qk_scale=qk_scale,
            pretrained_window=pretrained_window,
            layer_idx=layer_idx,
        )
        self.drop_path = DropPath(drop_path)
        self.norm2 = LayerNorm(dim, eps=layernorm_epsilon, layer_idx=layer_idx)
        # [S(0), B] -> col -> [S(0), S(-1)] -> row -> [S(0), P] -> all-reduce -> [S(0), B]
        self.mlp = MLP(
            dim, int(dim * mlp_ratio), drop, "gelu", init_method=trunc_normal, layer_idx=layer_idx
        )
        mask = None
        if shift > 0:
            mask = shifted_window_mask(*resolution, window, shift).to(dist.capture_mesh().device)
        self.register_buffer("attn_mask", mask, persistent=False)

    def window_attention(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, H * W, C]`` -> cyclic shift, windows, attention, merge, shift back."""
        (h, w), c = self.resolution, x.shape[-1]
        x = x.view(-1, h, w, c)
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        out = window_reverse(
            self.attn(window_partition(x, self.window), self.attn_mask), self.window, h, w
        )
        if self.shift:
            out = torch.roll(out, shifts=(self.shift, self.shift), dims=(1, 2))
        return out.reshape(-1, h * w, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self.resolution
        if x.shape[1] != h * w:
            raise ValueError(f"Swin block {self.layer_idx}: {x.shape[1]} tokens, want {h}x{w}")
        if self.post_norm:
            x = x + self.drop_path(self.norm1(self.window_attention(x)))
            return x + self.drop_path(self.norm2(self.mlp(x)))
        x = x + self.drop_path(self.window_attention(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """Halve the map: concatenate each 2x2 neighbourhood (``[x(0,0), x(1,0), x(0,1),
    x(1,1)]``, 4C channels) and project to 2C; v1 normalizes before the projection, v2
    (``post_norm``) after it."""

    def __init__(self, resolution, dim, post_norm, *, layer_idx):
        super().__init__()
        h, w = resolution
        if h % 2 or w % 2:
            raise ValueError(f"Swin: patch merging needs an even feature map, got {h}x{w}")
        self.resolution, self.post_norm, self.layer_idx = (h, w), post_norm, layer_idx
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, as in LiBai)
        self.reduction = Linear(4 * dim, 2 * dim, False, "data", trunc_normal, layer_idx=layer_idx)
        norm_dim = 2 * dim if post_norm else 4 * dim
        self.norm = LayerNorm(norm_dim, layer_idx=layer_idx)  # eps 1e-5, as LiBai / transformers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (h, w), c = self.resolution, x.shape[-1]
        x = x.view(-1, h, w, c)
        parts = (x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2])
        x = torch.cat(parts, dim=-1).view(-1, (h // 2) * (w // 2), 4 * c)
        if self.post_norm:
            return self.norm(self.reduction(x))
        return self.reduction(self.norm(x))


class SwinPatchEmbed(nn.Module):
    """Patches (a strided convolution, ``proj``), an optional LayerNorm (``patch_norm``), an
    optional absolute position embedding (``ape``), then dropout. Pipeline stage 0."""

    def __init__(
        self,
        img_size,
        patch_size,
        in_chans,
        embed_dim,
        patch_norm,
        ape,
        drop_rate,
    ):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}")
        self.layer_idx, self.img_size, self.in_chans = 0, img_size, in_chans
        self.resolution = (img_size // patch_size, img_size // patch_size)
        self.proj = PatchEmbedding(patch_size, in_chans, embed_dim, trunc_normal)
        self.norm = LayerNorm(embed_dim, layer_idx=0) if patch_norm else None  # eps 1e-5
        self.absolute_pos_embed = None
        if ape:
            num_patches = self.resolution[0] * self.resolution[1]
            self.absolute_pos_embed = create_parameter(
                (1, num_patches, embed_dim), trunc_normal, layer_idx=0
            )
        self.pos_drop = nn.Dropout(drop_rate)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        want = (self.in_chans, self.img_size, self.img_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"Swin expects images [batch, {want[0]}, {want[1]}, {want[2]}] (in_chans="
                f"{self.in_chans}, img_size={self.img_size}), got {list(images.shape)}; resize "
                "the images or set model.cfg.img_size."
            )
        x = self.proj(images)
        if self.norm is not None:
            x = self.norm(x)
        if self.absolute_pos_embed is not None:
            x = x + local_value(self.absolute_pos_embed)
        return self.pos_drop(x) if self.pos_drop.p > 0 else x
