"""Evaluator reductions across ranks under real torchrun launches (2 ranks, and 4 ranks for
the layouts where the dp or pp group is not the whole world)."""

from __future__ import annotations

import json
import math

import pytest
from launch import torchrun

# rank 0: 3 tokens at loss 1 + 1 token at loss 5; rank 1: 4 tokens at loss 2
DP_LOSS = (3 * 1.0 + 1 * 5.0 + 4 * 2.0) / 8
RANK0_LOSS = (3 * 1.0 + 1 * 5.0) / 4


def launch(nproc: int) -> list[dict]:
    out = torchrun("evaluation_reduce.py", nproc)
    for rank, r in enumerate(out):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    return out


@pytest.fixture(scope="module")
def results():
    return launch(2)


@pytest.fixture(scope="module")
def results4():
    return launch(4)


def test_dp_sums_tokens_and_correct_counts(results):
    for r in results:
        assert r["dp2"]["loss"] == pytest.approx(DP_LOSS)
        assert r["dp2"]["ppl"] == pytest.approx(math.exp(DP_LOSS))
        assert r["dp2"]["Acc@1"] == pytest.approx(75.0)  # 3 of 4 over both ranks
        assert r["dp2"]["Acc@2"] == pytest.approx(75.0)  # rank 0's label 2 is last of 3
        # inference_on_dataset with a plain module: each rank its batches, the totals on all
        assert r["dp2_module"]["loss"] == pytest.approx(DP_LOSS)


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


# the 4-rank layouts (pp, dp, tp) of evaluation_reduce.LAYOUTS_4, tp innermost
LAYOUTS_4 = {"dp2_tp2": (1, 2, 2), "pp2_dp2": (2, 2, 1), "pp2_tp2": (2, 1, 2), "dp4": (1, 4, 1)}


@pytest.mark.parametrize("name", sorted(LAYOUTS_4))
def test_sums_over_exactly_the_dp_and_pp_peers(results4, name):
    pp, dp, tp = LAYOUTS_4[name]
    for rank, r in enumerate(results4):
        p, d, t = divmod(rank // tp, dp) + (rank % tp,)
        assert r[name]["coord"] == [p, d, t]
        # summed over every (pp, dp) coordinate with this rank's tp coordinate, and no other
        peers = [(pi * dp + di) * tp + t for pi in range(pp) for di in range(dp)]
        total = sum(10.0**q for q in peers)
        assert r[name]["sum"] == [total, -total], (rank, peers)
        assert r[name]["input_kept"]


def test_pp_and_dp_together_reach_every_rank(results4):
    for r in results4:  # the last stage of each dp replica evaluated that replica's share
        assert r["pp2_dp2_ppl"]["loss"] == pytest.approx(DP_LOSS)
        assert r["pp2_dp2_ppl"]["ppl"] == pytest.approx(math.exp(DP_LOSS))
