"""The mesh helpers and fail-fast errors under a real 2-process torchrun launch."""

from __future__ import annotations

import pytest
from launch import torchrun


@pytest.fixture(scope="module")
def results():
    out = torchrun("dist_utils.py", 2)
    for rank, r in enumerate(out):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    return out


def test_sizes_that_do_not_fit_the_launch_fail_on_every_rank(results):
    for r in results:
        assert "not divisible by tensor_parallel_size (4)" in r["tp4_on_2"]
        assert "data_parallel_size=1 contradicts" in r["dp1_on_2"]


def test_divisibility_errors_name_the_key(results):
    for r in results:
        assert "hidden_size=33 is not divisible by tensor_parallel_size=2" in r["hidden_error"]
        assert (
            "num_attention_heads=3 is not divisible by tensor_parallel_size=2" in r["heads_error"]
        )
        assert "num_key_value_heads=1 is not divisible" in r["kv_heads_error"]
        assert "pipeline_num_layers=2 but the model has hidden_layers=3" in r["pp_layers_error"]
        assert "Unknown pipeline schedule 'Zigzag'" in r["bad_schedule"]
        assert "virtual_pipeline_size > 1" in r["interleaved_needs_vpp"]


def test_placement_vocabulary(results):
    r0, r1 = results
    assert r0["tp_sbp"] == ["Replicate()"]  # [dp_sbp, tp_sbp] collapsed to the tp dim
    assert r0["tp_hidden_sbp"] == ["Replicate()"]
    assert r0["tp_mesh_dims"] == ["tp"]
    assert (r0["tp_rank"], r1["tp_rank"]) == (0, 1)
    assert r0["dp_hidden_sbp"] == ["Shard(dim=0)"]
    assert (r0["dp_rank"], r1["dp_rank"]) == (0, 1)
    assert r0["dp_param_placements"] == ["Replicate()"]
    assert (r0["pp_rank"], r1["pp_rank"]) == (0, 1) and r0["last_stage"] == 1
    # the resolved layout is written back into the config (saved with the run)
    assert r0["recorded_stage_ids"] == [0, 1] and r0["recorded_dp"] == 1
    assert "belongs to pipeline stage" in r0["placement_other_stage"]
    assert (r0["main"], r0["last"], r1["main"], r1["last"]) == (True, False, False, True)
    for r in results:
        assert r["broadcast"] == {"from": 1}
        assert r["broadcast_default_src"] == {"from": 0}  # src defaults to rank 0


def test_vocab_padding_and_gathering(results):
    r0, r1 = results
    for r in results:
        assert r["padded_vocab"] == 100 and r["local_rows"] == 50 and r["padding_logged"]
        assert r["ttol_shape"] == [100, 8] and r["tton_shape"] == [100, 8]
    assert r0["ttol_rank0"] and not r1["ttol_rank0"]
