"""Every parallel layer equals its single-device PyTorch equivalent under tensor parallel.

Runs ``tests/support/dist_scripts/layers_tp.py`` under torchrun (CPU, gloo): on 2 ranks with
tensor_parallel_size=2, on 4 ranks with tp=2 x dp=2 and then tp=4. Each rank checks outputs,
input gradients and every weight gradient against a plain-PyTorch reference built from the
gathered full weights, plus the local shard shapes; the test judges from the per-rank results.
"""

from __future__ import annotations

import pytest
from launch import torchrun

#: check names every layout must report (one entry per compared layer configuration)
EXPECTED_CHECKS = {
    "Linear[data,bias=True,skip_bias_add=False]",
    "Linear[col,bias=True,skip_bias_add=True]",
    "Linear[row,bias=False,skip_bias_add=False]",
    "Linear[row,whole-input]",
    "VocabEmbedding[99->100]",
    "Embedding",
    "LayerNorm",
    "RMSLayerNorm",
    "MultiheadAttention[causal,heads=4,kv_heads=4]",
    "MultiheadAttention[causal+padding-mask,heads=4,kv_heads=4]",
    "MultiheadAttention[gqa-causal-rotary,heads=8,kv_heads=4]",
    "MultiheadAttention[gqa-cross,heads=8,kv_heads=4]",
    "MLP[gelu,gated=False]",
    "MLP[silu,gated=True]",
    "TransformerLayer[pre-norm]",
    "TransformerLayer[post-norm]",
    "TransformerLayer[pre-norm-decoder-gqa]",
    "TransformerLayer[post-norm-decoder]",
    "VocabEmbedding+LMLogits+ParallelCrossEntropyLoss[bias=False]",
    "VocabEmbedding+LMLogits+ParallelCrossEntropyLoss[bias=True]",
}


def _assert_all_ok(results: list[dict], nproc: int) -> None:
    failures = [
        f"--- rank {rank}: {r.get('error')}\n{r.get('trace', '')}"
        for rank, r in enumerate(results)
        if not r.get("ok")
    ]
    assert not failures, f"layers_tp.py failed on {len(failures)}/{nproc} ranks:\n" + "\n".join(
        failures
    )


@pytest.mark.parametrize(
    ("nproc", "layouts"),
    [(2, ["tp2_dp1"]), (4, ["tp2_dp2", "tp4_dp1"])],
    ids=["2ranks-tp2", "4ranks-tp2dp2-tp4"],
)
def test_parallel_layers_match_single_device(nproc, layouts):
    results = torchrun("layers_tp.py", nproc, timeout=300)
    _assert_all_ok(results, nproc)
    for rank, r in enumerate(results):
        assert sorted(r["max_diff"]) == sorted(layouts), f"rank {rank} ran {sorted(r['max_diff'])}"
        for layout in layouts:
            diffs = r["max_diff"][layout]
            missing = EXPECTED_CHECKS - set(diffs)
            assert not missing, f"rank {rank} {layout}: checks not run: {sorted(missing)}"
            worst = max(diffs, key=diffs.get)
            # the script already asserts 1e-5; recorded values are relative to each tensor's scale
            assert diffs[worst] <= 1e-5, f"rank {rank} {layout}: {worst} differs by {diffs[worst]}"
    # the full initial weights do not depend on the layout (nor on the rank)
    first = results[0]["init_fingerprints"][layouts[0]]
    for rank, r in enumerate(results):
        for layout in layouts:
            prints = r["init_fingerprints"][layout]
            changed = sorted(k for k in first if prints.get(k) != first[k])
            assert not changed, (
                f"rank {rank} {layout}: initial full weights differ from rank 0 {layouts[0]} "
                f"for {changed}"
            )
