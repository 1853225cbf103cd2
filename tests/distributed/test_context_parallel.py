"""Context parallelism: GPT-2 and Llama with each sequence split over two ranks (composed
with data and tensor parallel) equal the single-process run, and each rank holds its share
of the sequence (dist_scripts/cp_layouts.py)."""

from __future__ import annotations

import json

import pytest
import torch
from gpt_reference import GRAD_TOL, TINY_GPT, build_model, make_batch, reference_run
from launch import torchrun
from memory_probe import saved_activation_bytes
from sp_reference import TINY_LLAMA, build_llama, llama_batch, llama_reference_run

from libai import dist
from libai.runtime.parallel import ModelRunner

LAYOUTS = [
    # 4 ranks: 2 data-parallel replicas, each sequence over 2 context-parallel ranks
    {"name": "cp2xdp2", "dist": {"context_parallel_size": 2}, "models": ["gpt", "llama"]},
    {
        "name": "cp2xtp2",
        "dist": {"context_parallel_size": 2, "tensor_parallel_size": 2},
        "models": ["gpt", "llama"],
    },
    # gradient accumulation: the position ids of the share follow the micro-batches
    {
        "name": "cp2xdp2-accumulate2",
        "dist": {"context_parallel_size": 2},
        "microbatches": 2,
        "models": ["llama"],
    },
    # ZeRO over the dp x cp ranks: stage 2 reduces each gradient to its owner among the 4
    {"name": "cp2xdp2-zero2", "dist": {"context_parallel_size": 2}, "zero": 2, "models": ["gpt"]},
    {
        "name": "cp2xtp2-zero1",
        "dist": {"context_parallel_size": 2, "tensor_parallel_size": 2},
        "zero": 1,
        "models": ["llama"],
    },
    # ZeRO-3: FSDP2 over the dp and cp dims flattened (each of the 4 ranks holds 1/4 of every
    # parameter); with tp, over the 2 cp ranks of each tp shard
    {"name": "cp2xdp2-zero3", "dist": {"context_parallel_size": 2}, "zero": 3, "models": ["llama"]},
    {
        "name": "cp2xtp2-zero3",
        "dist": {"context_parallel_size": 2, "tensor_parallel_size": 2},
        "zero": 3,
        "models": ["gpt"],
    },
    # sequence parallel inside each cp share: norms, dropout and residuals over tp
    {
        "name": "cp2xtp2-sp",
        "dist": {"context_parallel_size": 2, "tensor_parallel_size": 2, "sequence_parallel": True},
        "models": ["gpt", "llama"],
    },
    # pipeline parallel: each stage runs its share of every micro-batch, the global positions
    # reach every stage (Llama's rotary embedding, GPT's position embedding on the first)
    {
        "name": "cp2xpp2",
        "dist": {"context_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 2},
        "microbatches": 2,
        "models": ["llama"],
    },
    {
        "name": "cp2xpp2-gpt",
        "dist": {"context_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 4},
        "microbatches": 2,
        "models": ["gpt"],
    },
    # the chunked head + loss (the same loss and gradients as the plain head): its token
    # mean over the whole sequences
    {
        "name": "cp2xtp2-chunked-loss",
        "dist": {"context_parallel_size": 2, "tensor_parallel_size": 2},
        "model_overrides": {"loss_chunk_size": 5},
        "models": ["gpt", "llama"],
    },
]


def one_process_saved_bytes(build, batch) -> int:
    """What autograd saves for backward in one process's training step on ``batch``."""
    dist.setup_dist_util({})
    model = build()
    runner = ModelRunner(model)
    return saved_activation_bytes(model, lambda: runner.forward_backward(batch))


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp")
    refs = {"gpt": reference_run(), "llama": llama_reference_run()}
    paths = {}
    for name, ref in refs.items():
        paths[name] = str(folder / f"{name}.pt")
        torch.save(ref, paths[name])
    results = torchrun("cp_layouts.py", 4, json.dumps(paths), json.dumps(LAYOUTS))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    return results


def test_bidirectional_attention_over_sequence_shards_equals_the_whole(cp_results):
    """A padding-mask (bidirectional) attention layer on cp2 and cp2 x tp2: each rank's output
    rows and the weight gradients summed over cp equal attention written out on the whole
    sequence (dist_scripts/cp_layouts.py: bidirectional_attention)."""
    for result in cp_results:
        without_pp = {n["name"] for n in LAYOUTS if "pipeline_parallel_size" not in n["dist"]}
        assert set(result["bidirectional"]) == without_pp
        for name, diffs in result["bidirectional"].items():
            assert diffs["out_diff"] <= GRAD_TOL, (name, diffs)
            assert diffs["grad_diff"] <= GRAD_TOL, (name, diffs)


def model_runs(cp_results) -> list[dict]:
    return [item for result in cp_results for item in result["results"]]


def test_context_parallel_equals_one_process(cp_results):
    cp_results = model_runs(cp_results)
    assert {(r["model"], r["name"]) for r in cp_results} == {
        (m, layout["name"]) for layout in LAYOUTS for m in layout["models"]
    }
    for r in cp_results:
        name = f"{r['model']} {r['name']}"
        assert r["init_diff"] == 0.0, name
        assert r["loss_diff"] <= GRAD_TOL, (name, r["losses"])
        if r["zero"] != 2:  # stage 2 drops the gradients other ranks own
            assert r["grad_diff"][0] <= GRAD_TOL, (name, r["grad_diff"])
        assert r["norm_diff"] <= GRAD_TOL, (name, r["norm_diff"])
        assert r["final_diff"][0] <= GRAD_TOL, (name, r["final_diff"])
        assert r["eval_diff"] <= GRAD_TOL, (name, r["eval_diff"])


def test_zero_shards_the_optimizer_state_over_data_and_context_parallel_ranks(cp_results):
    """Under ZeRO 1/2 the momentum buffers of the dp x cp ranks that hold the same parameters
    (all 4 on cp2 x dp2, the 2 cp ranks of a tp shard on cp2 x tp2) partition them: together
    exactly one copy, each rank less than its share of the others'."""
    runs = [r for r in model_runs(cp_results) if r["zero"] in (1, 2)]
    assert {(r["name"], r["zero"]) for r in runs} == {("cp2xdp2-zero2", 2), ("cp2xtp2-zero1", 1)}
    for name, holders in (("cp2xdp2-zero2", 4), ("cp2xtp2-zero1", 2)):
        ranks = [r for r in runs if r["name"] == name]
        local = ranks[0]["parameter_numel"]  # the same on every rank (tp shards here)
        assert all(r["parameter_numel"] == local for r in ranks)
        held = [r["optimizer_state_numel"] for r in ranks]
        assert sum(held) == local * len(ranks) // holders, (name, held, local)
        assert max(held) < local, (name, held)


def test_zero_3_shards_every_parameter_over_data_and_context_parallel_ranks(cp_results):
    """Under ZeRO-3 with cp2 x dp2 the 4 ranks hold disjoint dim-0 shards of every parameter:
    together exactly one copy of the model, each at most a quarter (rounded up per tensor)."""
    ranks = [r for r in model_runs(cp_results) if r["name"] == "cp2xdp2-zero3"]
    assert len(ranks) == 4
    full = ranks[0]["parameter_numel"]  # a DTensor's numel is its global size
    held = [r["local_parameter_numel"] for r in ranks]
    assert sum(held) == full, (held, full)
    assert max(held) < full / 4 * 1.1, (held, full)


def gathered_kv_bytes(model: str, rows: int, seq: int) -> int:
    """fp32 bytes of the whole sequence's keys and values of every attention layer."""
    if model == "gpt":
        layers, kv_heads = TINY_GPT["hidden_layers"], TINY_GPT["num_attention_heads"]
        head_dim = TINY_GPT["hidden_size"] // kv_heads
    else:
        layers, kv_heads = TINY_LLAMA["hidden_layers"], TINY_LLAMA["num_key_value_heads"]
        head_dim = TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"]
    return layers * 2 * rows * kv_heads * seq * head_dim * 4


def test_each_context_parallel_rank_holds_its_share_of_the_sequence(cp_results):
    """The blocks of a cp rank see seq / cp positions (seq / (cp tp) under sequence
    parallel, which splits the share again over tp), and what autograd keeps for backward
    on a cp2 rank is one process's on the same rows / 2, plus the keys and values gathered
    over the whole sequence for attention (x 1.25: each query chunk reads the keys up to
    its end, (2 cp + 1) / (2 cp) of them over the two chunks; a little more for the masks)."""
    cp_results = model_runs(cp_results)
    builds = {"gpt": (build_model, make_batch), "llama": (build_llama, llama_batch)}
    reference_bytes = {}
    for r in cp_results:
        assert r["cp"] == 2
        split = 2 * (r["tp"] if r["name"].endswith("-sp") else 1)
        assert r["block_positions"] == [r["sequence_length"] // split], r
        if r["tp"] == 1 and r["name"] == "cp2xdp2":
            build, batch_of = builds[r["model"]]
            if r["model"] not in reference_bytes:
                rows = {k: v[: r["rows"]] for k, v in batch_of(0).items()}
                reference_bytes[r["model"]] = one_process_saved_bytes(build, rows)
            half = reference_bytes[r["model"]] / 2
            kv = gathered_kv_bytes(r["model"], r["rows"], r["sequence_length"])
            assert r["activation_bytes"] - half <= 1.3 * kv, (r, half, kv)
            assert r["activation_bytes"] < 0.7 * reference_bytes[r["model"]]
    assert set(reference_bytes) == {"gpt", "llama"}
