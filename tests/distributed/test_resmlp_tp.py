"""ResMLP under tensor parallel (2 ranks, gloo): loss and every gradient equal the
plain-PyTorch ResMLP of the paper's equations on the full weights; the MLP is really split."""

from __future__ import annotations

import pytest
from launch import torchrun


def test_resmlp_tp2_equals_the_equations_and_splits_the_mlp():
    results = torchrun("resmlp_tp.py", 2)
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        assert r["loss"] == pytest.approx(r["want"], rel=1e-6)
        assert r["n_grads"] == 2 + 2 * 12 + 4  # patch embed, 2 blocks, final affine, head
        assert r["max_grad_diff"] < 1e-5
        # embed_dim 12, hidden 48: column-parallel [48/2, 12], row-parallel [12, 48/2]
        assert r["h_to_4h_local"] == [24, 12] and r["4h_to_h_local"] == [12, 24]
