"""LiBai's ``PatchEmbedding`` layer (its vision projects build on it: MAE, MOCOV3)."""

from __future__ import annotations

import torch
from torch import nn

from libai import dist


class PatchEmbedding(nn.Module):
    """Images ``[batch, in_chans, H, W]`` cut into ``patch_size`` patches by
    ``proj = Conv2d(in_chans, embed_dim, kernel_size=stride=patch_size)``, flattened to
    ``[batch, patches, embed_dim]`` (``flatten``), then ``norm_layer(embed_dim)`` if given.
    LiBai's signature and parameter names (``proj.weight``, ``proj.bias``); the parameters
    are replicated ``[B, B]`` on the layer's stage (plain tensors, on this rank's device)."""

    def __init__(
        self,
        img_size=224,
        patch_size=16,
        in_chans=3,
        embed_dim=768,
        norm_layer=None,
        flatten=True,
        *,
        layer_idx=0,
    ):
        super().__init__()
        img_size = img_size if isinstance(img_size, tuple) else (img_size, img_size)
        patch_size = patch_size if isinstance(patch_size, tuple) else (patch_size, patch_size)
        self.img_size, self.patch_size, self.layer_idx = img_size, patch_size, layer_idx
        self.grid_size = (img_size[0] // patch_size[0], img_size[1] // patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.flatten = flatten
        self._dist_util = dist.capture_mesh()  # the mesh it is built on
        self.proj = nn.Conv2d(
            in_chans,
            embed_dim,
            kernel_size=patch_size,
            stride=patch_size,
            device=self._dist_util.device,
        )
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(
                f"PatchEmbedding(img_size={self.img_size}) got images of {tuple(x.shape[-2:])}"
            )
        # [S(0), B] images x [B, B] kernel -> [S(0), B] patches (no communication)
        x = self.proj(x)
        if self.flatten:
            x = x.flatten(2).transpose(1, 2)  # BCHW -> BNC
        return self.norm(x)
