"""LiBai's PatchEmbedding layer against its formula: a strided convolution, flattened."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from libai.layers import LayerNorm, PatchEmbedding


def test_patches_are_the_strided_convolution_flattened():
    torch.manual_seed(0)
    layer = PatchEmbedding(img_size=8, patch_size=4, in_chans=3, embed_dim=5)
    images = torch.randn(2, 3, 8, 8)
    want = torch.einsum("bchpwq,ecpq->bhwe", images.view(2, 3, 2, 4, 2, 4), layer.proj.weight)
    want = (want + layer.proj.bias).reshape(2, 4, 5)  # patches in row-major order
    torch.testing.assert_close(layer(images), want)
    assert layer.num_patches == 4 and layer.grid_size == (2, 2)
    assert sorted(n for n, _ in layer.named_parameters()) == ["proj.bias", "proj.weight"]
    grid = PatchEmbedding(img_size=(8, 4), patch_size=4, in_chans=3, embed_dim=5, flatten=False)
    assert grid(torch.randn(1, 3, 8, 4)).shape == (1, 5, 2, 1)
    normed = PatchEmbedding(img_size=8, patch_size=4, in_chans=3, embed_dim=5, norm_layer=LayerNorm)
    patches = F.conv2d(images, normed.proj.weight, normed.proj.bias, stride=4)
    torch.testing.assert_close(normed(images), normed.norm(patches.flatten(2).transpose(1, 2)))
    with pytest.raises(ValueError, match=r"img_size=\(8, 8\)\) got images of \(6, 6\)"):
        layer(torch.randn(1, 3, 6, 6))
