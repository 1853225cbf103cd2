"""``ParallelCrossEntropyLoss`` on data-parallel ranks holding unequal numbers of valid
tokens, against ``F.cross_entropy`` of one process on the whole global batch.

Runs ``tests/support/dist_scripts/parallel_heads_more.py`` under torchrun (2 ranks, CPU/gloo,
dp=2): with ``over_data_parallel`` the ranks' losses (and gradients) average to the token mean
of the global batch, including a global batch with a single valid token; without it each rank
returns its own token mean.
"""

from __future__ import annotations

import pytest
from launch import torchrun

CASES = ("3-and-1", "0-and-1")


@pytest.fixture(scope="module")
def results():
    out = torchrun("parallel_heads_more.py", 2, timeout=300)
    for rank, r in enumerate(out):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        assert r["dp"] == 2
    return out


@pytest.mark.parametrize("case", CASES)
def test_over_data_parallel_averages_to_the_global_token_mean(results, case):
    losses = [r[case]["over_dp"] for r in results]
    assert sum(losses) / len(losses) == pytest.approx(results[0][case]["want_global"], rel=1e-5)
    for rank, r in enumerate(results):
        got, want = r[case]["grad"], r[case]["want_grad"]
        for row_got, row_want in zip(got, want):
            assert row_got == pytest.approx(row_want, rel=1e-5, abs=1e-6), f"rank {rank}"


@pytest.mark.parametrize("case", CASES)
def test_without_over_data_parallel_each_rank_returns_its_own_mean(results, case):
    for r in results:
        assert r[case]["local"] == pytest.approx(r[case]["want_local"], rel=1e-5, abs=1e-7)
