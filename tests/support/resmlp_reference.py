"""An independent plain-PyTorch ResMLP from the paper's equations (arXiv:2105.03404), on a
dict of weights named as libai's ResMLP names them; the reference of the ResMLP tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_logits(p: dict, images: torch.Tensor, depth: int, patch: int) -> torch.Tensor:
    """ResMLP from the equations, on a dict of weights:
    Aff(x) = alpha * x + beta;  Z = X + gamma_1 * (A Aff(X)^T)^T  (A mixes patches);
    Y = Z + gamma_2 * W2 GELU(W1 Aff(Z));  logits = head(mean_patches(Aff(Y)))."""
    x = F.conv2d(images, p["patch_embed.weight"], p["patch_embed.bias"], stride=patch)
    x = x.flatten(2).transpose(1, 2)  # [batch, patches, channels]

    def aff(name, t):
        return p[f"{name}.alpha"] * t + p[f"{name}.beta"]

    for i in range(depth):
        b = f"blocks.{i}."
        a = aff(b + "norm1", x)
        cross_patch = torch.einsum("qp,bpc->bqc", p[b + "attn.weight"], a)
        cross_patch = cross_patch + p[b + "attn.bias"][None, :, None]
        x = x + p[b + "gamma_1"] * cross_patch
        h = aff(b + "norm2", x) @ p[b + "mlp.dense_h_to_4h.weight"].T
        h = F.gelu(h + p[b + "mlp.dense_h_to_4h.bias"])
        h = h @ p[b + "mlp.dense_4h_to_h.weight"].T + p[b + "mlp.dense_4h_to_h.bias"]
        x = x + p[b + "gamma_2"] * h
    pooled = aff("norm", x).mean(dim=1)
    return pooled @ p["head.weight"].T + p["head.bias"]
