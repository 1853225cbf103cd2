"""Evaluator reductions across ranks under a real 2-process torchrun launch."""

from __future__ import annotations

import json
import math

import pytest
from launch import torchrun

# rank 0: 3 tokens at loss 1 + 1 token at loss 5; rank 1: 4 tokens at loss 2
DP_LOSS = (3 * 1.0 + 1 * 5.0 + 4 * 2.0) / 8
RANK0_LOSS = (3 * 1.0 + 1 * 5.0) / 4


@pytest.fixture(scope="module")
def results():
    out = torchrun("evaluation_reduce.py", 2)
    for rank, r in enumerate(out):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    return out


def test_dp_sums_tokens_and_correct_counts(results):
    for r in results:
        assert r["dp2"]["loss"] == pytest.approx(DP_LOSS)
        assert r["dp2"]["ppl"] == pytest.approx(math.exp(DP_LOSS))
        assert r["dp2"]["Acc@1"] == pytest.approx(75.0)  # 3 of 4 over both ranks
        assert r["dp2"]["Acc@2"] == pytest.approx(75.0)  # rank 0's label 2 is last of 3


def test_tp_peers_are_not_summed(results):
    r0, r1 = results
    assert r0["tp2"]["loss"] == pytest.approx(RANK0_LOSS)
    assert r1["tp2"]["loss"] == pytest.approx(2.0)
    assert (r0["tp2"]["Acc@1"], r1["tp2"]["Acc@1"]) == (50.0, 100.0)


def test_pp_last_stage_results_reach_every_rank(results):
    for r in results:
        assert r["pp2"]["loss"] == pytest.approx(RANK0_LOSS)
        assert r["pp2"]["Acc@1"] == pytest.approx(50.0)
        assert r["pp2_callable"]["loss"] == pytest.approx(2.0)
        assert "pipeline_parallel_size > 1" in r["pp_module_error"]


def test_json_writer_writes_on_rank0_only(results):
    lines = results[0]["json_lines"]
    assert len(lines) == 1  # rank 1 constructed a writer too, but wrote nothing
    assert json.loads(lines[0])["total_loss"] == 1.0
