"""Sequence parallel (``train.dist.sequence_parallel=True``): GPT-2 and Llama on tp2, GPT-2 on
tp2 x pp2 and dp2 x tp2 equal the single-process run; inside each block the norms and the
residual stream hold seq / tp positions per rank; bad inputs raise before any collective."""

from __future__ import annotations

import re

import pytest
import torch
from gpt_reference import BATCH, GRAD_TOL, SEQ, TINY_GPT, reference_run
from launch import torchrun_cases
from sp_reference import TINY_LLAMA, llama_reference_run

from libai import dist
from libai.layers import TransformerLayer

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": TINY_GPT["hidden_layers"]}
CASES_2 = [
    {
        "name": "gpt-tp2",
        "model": "gpt",
        "dist": {"tensor_parallel_size": 2},
        "control": True,
        "errors": True,
    },
    # the chunked LM loss on the gathered sequence: the reference's plain-head loss and grads
    {
        "name": "llama-tp2",
        "model": "llama",
        "dist": {"tensor_parallel_size": 2},
        "model_kwargs": {"loss_chunk_size": 40},
    },
]
CASES_4 = [
    {
        "name": "gpt-tp2xpp2",
        "model": "gpt",
        "dist": {**PP, "tensor_parallel_size": 2},
        "microbatches": 2,
        "pipeline_errors": True,
    },
    # with dp: the tp sum of the sequence-parallel grads comes after the (overlapped) dp
    # all-reduce; selective checkpointing recomputes the blocks' collectives in backward
    {
        "name": "gpt-dp2xtp2",
        "model": "gpt",
        "dist": {"tensor_parallel_size": 2, "data_parallel_size": 2},
        "runner": {"activation_checkpointing": "selective"},
    },
]
#: replicated parameters used on sequence shards: their gradients are summed over tp
SP_PARAM = re.compile(
    r"norm(_f)?\.(weight|bias)$|(\.dense|dense_4h_to_h)\.bias$|position_embeddings"
)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "references.pt"
    torch.save({"gpt": reference_run(), "llama": llama_reference_run()}, path)
    dist.reset_dist_util()
    return str(path)


def run_cases(references, nproc, cases) -> dict[str, list[dict]]:
    return torchrun_cases("sequence_parallel.py", nproc, references, cases)


def check_numbers(items):
    """fp32 rounding tolerances (gpt_reference): SGD is linear in the gradients."""
    for item in items:
        assert item["init_diff"] == 0.0, item["init_worst"]
        assert item["loss_diff"] <= GRAD_TOL, item["losses"]
        assert item["grad_diff"] <= GRAD_TOL, (item["grad_worst"], item["grad_diff"])
        assert item["grad_norm_diff"] <= GRAD_TOL, item["grad_norm_diff"]
        assert item["final_diff"] <= GRAD_TOL, (item["final_worst"], item["final_diff"])
        assert item["losses"] == items[0]["losses"]


def check_marked(items):
    """Exactly the replicated parameters of the sequence-parallel region are summed over tp."""
    for item in items:
        expected = {n for n in item["all_params"] if SP_PARAM.search(n)}
        assert expected, item["all_params"]
        assert set(item["sequence_parallel_params"]) == expected


def check_block_shapes(shapes, layers, batch, hidden, tp=2):
    """Norm inputs, the residual stream (block in / out) and the attention / MLP outputs hold
    seq / tp positions; the column-parallel projections see the whole sequence."""
    local = [batch, SEQ // tp, hidden]
    for i in layers:
        for what in ("block_in", "block_out", "input_norm_in", "input_norm_out"):
            assert shapes[f"{i}.{what}"] == local, (i, what, shapes[f"{i}.{what}"])
        for what in ("mlp_norm_in", "attention_in", "attention_out", "mlp_in", "mlp_out"):
            assert shapes[f"{i}.{what}"] == local, (i, what, shapes[f"{i}.{what}"])
        assert shapes[f"{i}.qkv_in"] == local
        assert shapes[f"{i}.qkv_out"][:2] == [batch, SEQ]  # all-gathered sequence
        assert shapes[f"{i}.mlp_up_out"][:2] == [batch, SEQ]


def test_tp2_gpt_llama_and_bad_inputs(references):
    by_case = run_cases(references, 2, CASES_2)
    for name in ("gpt-tp2", "llama-tp2"):
        check_numbers(by_case[name])
        check_marked(by_case[name])
    gpt, llama = by_case["gpt-tp2"], by_case["llama-tp2"]
    for item in gpt:
        shapes = item["shapes"]
        check_block_shapes(shapes, range(TINY_GPT["hidden_layers"]), BATCH, TINY_GPT["hidden_size"])
        assert shapes["head_in"] == [BATCH, SEQ // 2, TINY_GPT["hidden_size"]]
        assert shapes["head_out"] == [BATCH, SEQ, 50]  # whole sequence, vocab 99 padded / 2
        # without the tp sum of their gradients the norms / biases are far off (the classic bug)
        assert item["unsynced_grad_diff"] > 1e3 * GRAD_TOL, item["unsynced_grad_diff"]
    for item in llama:
        shapes = item["shapes"]
        check_block_shapes(
            shapes, range(TINY_LLAMA["hidden_layers"]), BATCH, TINY_LLAMA["hidden_size"]
        )
        assert "head_out" not in shapes  # the chunked loss never builds the logits
    for item in gpt:
        errors = item["errors"]
        assert (
            "sequence length 11 is not divisible by tensor_parallel_size=2"
            in errors["odd_sequence"]
        )
        assert "train.dist.sequence_parallel" in errors["odd_sequence"]
        assert "KV cache" in errors["kv_cache"]
        assert (
            "BertForPreTraining does not support sequence parallelism"
            in errors["unsupported_model"]
        )
        assert "train.dist.sequence_parallel=False" in errors["unsupported_model"]


def test_tp2xpp2_and_dp2xtp2_gpt(references):
    by_case = run_cases(references, 4, CASES_4)
    check_numbers(by_case["gpt-dp2xtp2"])
    check_numbers(by_case["gpt-tp2xpp2"])
    for item in by_case["gpt-tp2xpp2"]:
        # 2 micro-batches of 8; each stage's first block receives a sequence shard, which is
        # what crosses the stage boundary
        stage_layers = [0, 1] if item["pipeline_rank"] == 0 else [2, 3]
        check_block_shapes(item["shapes"], stage_layers, BATCH // 2, TINY_GPT["hidden_size"])
        check_marked([item])
        # raised on both stages (the second never sees the token ids), nobody hangs
        assert "sequence length 11 is not divisible" in item["errors"]["odd_sequence"]
    for item in by_case["gpt-dp2xtp2"]:
        check_block_shapes(
            item["shapes"], range(TINY_GPT["hidden_layers"]), BATCH // 2, TINY_GPT["hidden_size"]
        )


@pytest.mark.parametrize(
    ("dist_cfg", "world"),
    [({"sequence_parallel": True}, 1), ({"sequence_parallel": True, "data_parallel_size": 2}, 2)],
)
def test_sequence_parallel_needs_tensor_parallel(dist_cfg, world):
    with pytest.raises(ValueError, match=r"sequence_parallel=True needs tensor_parallel_size > 1"):
        dist.resolve_layout(dist_cfg, world)


def test_sequence_parallel_must_be_a_bool():
    with pytest.raises(ValueError, match="train.dist.sequence_parallel must be True or False"):
        dist.resolve_layout({"sequence_parallel": "yes", "tensor_parallel_size": 2}, 2)


def test_cross_attention_block_refuses_sequence_parallel():
    with pytest.raises(ValueError, match="cross-attention does not support sequence parallel"):
        TransformerLayer(32, 64, 4, is_decoder=True, sequence_parallel=True)
