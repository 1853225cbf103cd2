"""The memory estimator (libai.runtime.memory_estimator, tools/estimate_memory.py).

Parameter, gradient and optimizer-state bytes per rank equal what real runs hold, exactly:
one process through the trainer's config path (AdamW, SGD with and without momentum), and
under torchrun dp2 x tp2 and dp2 x pp2 without ZeRO and with ZeRO 1/2/3. The activation
estimate is within ``ACT_RTOL`` of the bytes a forward keeps for backward (saved tensors
plus what Python still holds, :func:`memory_probe.held_activation_bytes`), and full /
selective checkpointing, the chunked loss and sequence parallel lower it as predicted. The
CLI prints the table; bad input is one clear error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch import torchrun
from memory_cases import (
    ACT_BATCH,
    ACT_LLAMA,
    ACT_RTOL,
    ACT_SEQ,
    activation_case,
    local_bytes,
    measured_state,
)

from libai import dist
from libai.config import LazyCall, LazyConfig, instantiate
from libai.layers import LayerNorm
from libai.models import LlamaForCausalLM
from libai.optim import build_optimizer
from libai.runtime.memory_estimator import (
    TrainSettings,
    estimate_config,
    estimate_memory,
    fsdp_shard_numel,
    in_flight_micro_batches,
)
from libai.runtime.parallel import ModelRunner

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "gpt2_pretrain.py"
TINY = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=4",
    "model.cfg.ffn_hidden_size=64",
    "model.cfg.max_seq_length=16",
    "model.cfg.vocab_size=99",
    "tokenization.setup=False",
    "train.train_micro_batch_size=2",
]
_SGD = ["optim._target_=torch.optim.SGD", "~optim.betas", "~optim.eps"]
OPTIMIZERS = {"adamw": [], "sgd_momentum": [*_SGD, "+optim.momentum=0.9"], "sgd": _SGD}


def load(overrides):
    return LazyConfig.apply_overrides(LazyConfig.load(str(CONFIG)), list(overrides))


def close(held: int, predicted: int, rtol: float = ACT_RTOL) -> bool:
    return abs(predicted - held) <= rtol * held


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_single_process_bytes_equal_the_trainer_run(kind):
    cfg = load(TINY + OPTIMIZERS[kind])
    _, settings, rows = estimate_config(cfg, 1)
    assert settings.optimizer == kind and len(rows) == 1
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    optimizer = build_optimizer(cfg.optim, model)
    runner = ModelRunner(model)
    ids = torch.randint(0, 99, (2, 16))
    runner.forward_backward({"input_ids": ids, "labels": ids})
    grads = local_bytes({id(p): p.grad for p in model.parameters()}.values())
    optimizer.step()
    row = rows[0]
    got = {"parameters": row.parameters, "gradients": row.gradients, "optimizer": row.optimizer}
    assert got == measured_state(model, optimizer, grads)
    assert row.parameters == row.gradients > 0
    if kind != "adamw":
        assert row.optimizer == (row.parameters if kind == "sgd_momentum" else 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"activation_checkpointing": "full"},
        {"activation_checkpointing": "selective"},
        {"model_overrides": {"loss_chunk_size": 64}},
        {"amp_dtype": torch.bfloat16},
        {
            "model_overrides": {
                f"{k}_dropout_prob": 0.1 for k in ("embedding", "attention", "output")
            }
        },
        {"llama": True},
        {"llama": True, "model_overrides": {"loss_chunk_size": 64}},
        {"llama": True, "amp_dtype": torch.bfloat16},
    ],
    ids=[
        "none", "full", "selective", "chunked_loss", "bf16", "dropout", "llama", "llama_chunked",
        "llama_bf16",
    ],
)  # fmt: skip
def test_activation_estimate_single_process(kwargs):
    case = activation_case(dist.get_dist_util().layout, 0, **kwargs)
    assert close(case["held"], case["predicted"]), case


MOE = dict(num_experts=4, top_k=2)
SHARED = dict(shared_expert_ffn_hidden_size=96, shared_expert_gate=True, norm_topk_prob=False)


@pytest.mark.parametrize(
    "moe, amp",
    [
        (MOE, None),
        ({**MOE, "aux_loss_coeff": 0.1, "z_loss_coeff": 0.01, "seq_aux_loss_coeff": 0.01}, None),
        (MOE, torch.bfloat16),
        ({**MOE, "capacity_factor": 0.6, "pad_to_capacity": True}, None),
        ({**MOE, **SHARED}, None),
        ({**MOE, **SHARED}, torch.bfloat16),
    ],
    ids=["dropless", "every_loss", "bf16", "padded", "shared", "shared_bf16"],
)
def test_moe_activation_estimate_single_process(moe, amp):
    """Mixture-of-Experts Llama blocks (libai.runtime.memory_moe): the router, the experts'
    rows and intermediates, the combine, shared experts with Qwen's gate."""
    case = activation_case(
        dist.get_dist_util().layout, 0, llama=True, model_overrides={"moe": moe}, amp_dtype=amp
    )
    assert close(case["held"], case["predicted"]), case


def test_moe_capacity_estimate_is_the_bound():
    """Capacity mode without padding keeps the rows its experts took: at most the capacity's
    (the estimate), fewer where experts ran under it."""
    moe = {**MOE, "capacity_factor": 0.6}
    case = activation_case(dist.get_dist_util().layout, 0, llama=True, model_overrides={"moe": moe})
    assert case["held"] <= case["predicted"] <= 1.1 * case["held"], case


class _LlamaWithLayerNormFinal(LlamaForCausalLM):
    """Llama's RMSNorm blocks with a LayerNorm as the final norm (a user's own mix)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.model.norm = LayerNorm(kwargs["hidden_size"], layer_idx=-1)


def test_the_final_norm_kind_is_its_own_not_the_blocks():
    """The final norm's extra bytes follow its own kind: swapping Llama's final RMSNorm
    (fp32 rstd and normalized input: 4 + 4h per token) for a LayerNorm (fp32 mean and rstd:
    8) lowers held and predicted bytes by the same (4h - 4) per token."""
    layout = dist.get_dist_util().layout
    rms = activation_case(layout, 0, llama=True)
    mixed = activation_case(layout, 0, llama=True, model_cls=_LlamaWithLayerNormFinal)
    assert close(mixed["held"], mixed["predicted"]), mixed
    tokens, h = ACT_BATCH * ACT_SEQ, ACT_LLAMA["hidden_size"]
    assert rms["predicted"] - mixed["predicted"] == tokens * (4 * h - 4)
    assert rms["held"] - mixed["held"] == tokens * (4 * h - 4)


def test_checkpointing_and_chunked_loss_lower_activations_as_predicted():
    layout = dist.get_dist_util().layout
    cases = {
        mode: activation_case(layout, 0, activation_checkpointing=mode)
        for mode in (False, "selective", "full")
    }
    cases["chunked"] = activation_case(layout, 0, model_overrides={"loss_chunk_size": 64})
    for key in ("held", "predicted"):
        assert cases["full"][key] < cases["selective"][key] < cases[False][key], cases
        assert cases["chunked"][key] < cases[False][key], cases
    for low in ("full", "selective", "chunked"):
        saved = {k: cases[False][k] - cases[low][k] for k in ("held", "predicted")}
        assert close(saved["held"], saved["predicted"], 2 * ACT_RTOL), (low, saved)


def test_fsdp_shard_numel_is_torch_chunk():
    for rows, world in [(7, 2), (5, 4), (1, 2), (8, 4), (3, 4)]:
        x = torch.empty(rows, 3)
        chunks = list(x.chunk(world)) + [x[:0]] * world
        assert [fsdp_shard_numel((rows, 3), world, r) for r in range(world)] == [
            c.numel() for c in chunks[:world]
        ]


LAYOUTS = [
    {"name": "dp2_tp2", "dist": {"tensor_parallel_size": 2}, "activations": True},
    {  # unbalanced custom stages: 3 blocks + embedding, 1 block + head (the tied copy)
        "name": "dp2_pp2",
        "dist": {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": [0, 0, 0, 1]},
        "microbatches": 2,
    },
    {"name": "dp4_hsdp", "dist": {}, "stages": [None, 3], "hsdp": 2},
    # cp2 x pp2: each stage's parameters, ZeRO 1/2/3 over the 2 cp ranks of a stage
    {
        "name": "cp2_pp2",
        "dist": {"context_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 4},
        "stages": [None, 1, 2, 3],
        "microbatches": 2,
    },
    # dp2 x cp2: ZeRO 1/2/3 shard over the 4 dp x cp ranks; a share of each sequence
    {
        "name": "dp2_cp2",
        "dist": {"context_parallel_size": 2},
        "stages": [None, 1, 2, 3],
        "cp_activations": True,
    },
]


def test_layouts_hold_the_predicted_bytes():
    results = torchrun("memory_layouts.py", 4, json.dumps(LAYOUTS))
    assert all(r["ok"] for r in results), [r.get("error") for r in results]
    for rank, result in enumerate(results):
        for layout in LAYOUTS:
            cases = result[layout["name"]]
            for stage in [str(s) for s in layout.get("stages", [None, 1, 2, 3])]:
                case = cases[stage]
                assert case["measured"] == case["predicted"], (rank, layout["name"], stage, case)
            base = cases["None"]["measured"]
            if "3" in cases:
                assert cases["3"]["measured"]["parameters"] < base["parameters"]
            if "1" in cases:
                z1, z2 = cases["1"]["measured"], cases["2"]["measured"]
                assert z1["optimizer"] < base["optimizer"]
                assert z1["gradients"] == base["gradients"] > z2["gradients"]
        act, act_sp = result["dp2_tp2"]["act"], result["dp2_tp2"]["act_sp"]
        assert close(act["held"], act["predicted"]), (rank, act)
        assert close(act_sp["held"], act_sp["predicted"]), (rank, act_sp)
        assert act_sp["held"] < act["held"] and act_sp["predicted"] < act["predicted"]
        # context parallel: the share's activations (and the gathered keys and values) as
        # predicted, well under one process's whole sequence
        act_cp = result["dp2_cp2"]["act_cp"]
        assert close(act_cp["held"], act_cp["predicted"]), (rank, act_cp)
        assert act_cp["held"] < 0.7 * result["dp2_cp2"]["act_one_predicted"], (rank, act_cp)


def test_in_flight_micro_batches_follow_the_schedule():
    def layout(schedule, vpp=1):
        ids = [i * 4 * vpp // 16 for i in range(16)]
        return dist.resolve_layout(
            {
                "pipeline_parallel_size": 4,
                "virtual_pipeline_size": vpp,
                "pipeline_schedule": schedule,
                "custom_pipeline_stage_id": ids,
            },
            4,
        )

    assert [in_flight_micro_batches(layout("1F1B"), k, 8) for k in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches(layout("1F1B"), k, 2) for k in range(4)] == [2, 2, 2, 1]
    assert [in_flight_micro_batches(layout("GPipe"), k, 8) for k in range(4)] == [8] * 4
    # interleaved, 2 chunks of half the rank's activations: Megatron's warm-up + 1
    got = [in_flight_micro_batches(layout("Interleaved1F1B", 2), k, 8) for k in range(4)]
    assert got == [(2 * (4 - k - 1) + 4 + 1) / 2 for k in range(4)]
    assert in_flight_micro_batches(dist.resolve_layout({}, 1), 0, 8) == 1


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "estimate_memory.py"), str(CONFIG), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_cli_prints_the_table(sample_env):
    env = {**sample_env, "PYTHONPATH": str(ROOT)}
    proc = _cli(
        "train.dist.tensor_parallel_size=2",
        "train.zero_optimization.enabled=True",
        "train.zero_optimization.stage=3",
        "train.activation_checkpoint.enabled=True",
        "--world-size",
        "4",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "pp=1 dp=2 tp=2 (world 4)" in lines[0] and "ZeRO 3" in lines[0]
    assert "checkpointing full" in lines[0]
    header = lines[2].split(" | ")
    assert header[:5] == ["rank", "pp", "dp", "tp", "params"] and header[-1] == "total"
    rows = [line.split(" | ") for line in lines[3:]]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert all(float(r[-1]) > 0 for r in rows)

    bad = _cli("train.dist.tensor_parallel_sise=2", env=env)
    assert bad.returncode == 1 and "tensor_parallel_size" in bad.stderr, bad.stderr


def test_zero_on_one_rank_estimates_the_unsharded_run():
    """ZeRO on one data-parallel rank: the run is unsharded, and so is the estimate."""
    plain = estimate_config(load(TINY), 1)
    assert estimate_config(load([*TINY, "train.zero_optimization.enabled=True"]), 1) == plain


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size"):
        estimate_config(load([*TINY, "train.dist.tensor_parallel_size=2"]), 3)
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size=2"):
        estimate_config(
            load([*TINY, "train.dist.tensor_parallel_size=2", "model.cfg.ffn_hidden_size=63"]),
            2,
        )


def test_mixed_precision_o2_state_bytes_equal_the_run():
    """``train.amp.level="O2"``: 2-byte parameters and gradients, the optimizer's fp32
    masters on top of its moments -- against a run through the runtime's O2 path (norm
    parameters stay fp32 there and are counted at 2 bytes by the estimator: a small share,
    bounded here)."""
    from libai.runtime.parallelize import parallelize, shard_optimizer_for
    from libai.runtime.spec import RunSpec

    cfg = load([*TINY, "train.amp.enabled=True", "train.amp.level=O2"])
    _, settings, rows = estimate_config(cfg, 1)
    assert settings.master_weights
    dist.setup_dist_util({})
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    spec = RunSpec.from_config(cfg.train)
    spec.num_accumulation_steps = 1
    parts = parallelize(model, spec)
    optimizer = shard_optimizer_for(parts, build_optimizer(cfg.optim, model))
    ids = torch.randint(0, 99, (2, 16))
    parts.runner.forward_backward({"input_ids": ids, "labels": ids})
    params = local_bytes(model.parameters())
    grads = local_bytes(p.grad for p in model.parameters())
    masters = local_bytes(m for _, m in parts.runner.master_weights.pairs)
    parts.runner.optimizer_step(optimizer)
    moments = sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
    )
    norm_share = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    row = rows[0]
    assert row.parameters == row.gradients
    assert 0 < params - row.parameters == 2 * norm_share
    assert grads - row.gradients == 2 * norm_share
    # the estimator counts norm masters too (they are stepped directly: 4 bytes of parameter)
    assert row.optimizer == moments + masters + 4 * norm_share


def test_a_configs_micro_batches_per_step_are_the_ones_in_flight():
    """pp2 with 4 micro-batches per step: GPipe keeps all 4 in flight on each stage, 1F1B
    one per stage still to pass (2 on the first, 1 on the last)."""
    for schedule, flight in (("GPipe", [4, 4]), ("1F1B", [2, 1])):
        cfg = load(
            [
                *TINY,
                "train.dist.pipeline_parallel_size=2",
                f"train.dist.pipeline_schedule={schedule}",
                "train.num_accumulation_steps=4",
            ]
        )
        layout, settings, rows = estimate_config(cfg)
        assert layout.pipeline_parallel_size == 2 and settings.num_microbatches == 4
        assert [r.in_flight for r in rows] == flight, schedule


def test_experts_are_counted_per_expert_parallel_rank():
    """A Mixture-of-Experts Llama on dp4 x ep2: each rank holds half the experts and every
    dense weight; its activations are one process's (balanced routing: each rank's experts
    take as many rows as its tokens chose), and selective checkpointing of MoE blocks is
    refused in one line."""
    from libai.layers import MoE

    moe = dict(num_experts=4, top_k=2, expert_ffn_hidden_size=96)
    kwargs = {**ACT_LLAMA, "moe": moe}
    model = LlamaForCausalLM(**kwargs)  # one process: every expert
    experts = sum(
        p.numel() for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()
    )
    assert experts == 2 * 3 * 4 * 96 * 128  # layers x (up, gate, down) x experts x f x h
    layout = dist.resolve_layout({"expert_parallel_size": 2}, 4)
    settings = TrainSettings(micro_batch_size=1, seq_length=8, optimizer="sgd", activations=False)
    rows = estimate_memory(LazyCall(LlamaForCausalLM)(**kwargs), layout, settings)
    total = sum(p.numel() for p in model.parameters())
    assert [r.parameters for r in rows] == [4 * (total - experts // 2)] * 4
    with_acts = TrainSettings(micro_batch_size=1, seq_length=8)
    ep2 = estimate_memory(LazyCall(LlamaForCausalLM)(**kwargs), layout, with_acts)
    one = estimate_memory(
        LazyCall(LlamaForCausalLM)(**kwargs), dist.resolve_layout({}, 1), with_acts
    )
    assert {r.activations_micro_batch for r in ep2} == {one[0].activations_micro_batch}
    assert one[0].activations_micro_batch > 0
    with pytest.raises(ValueError, match="selective checkpointing of Mixture-of-Experts"):
        estimate_memory(
            LazyCall(LlamaForCausalLM)(**kwargs),
            layout,
            TrainSettings(micro_batch_size=1, seq_length=8, checkpointing="selective"),
        )
    # ZeRO-2 partitions the dense weights' gradients and state over the 4 dp ranks; each
    # rank keeps its experts' whole
    zero = TrainSettings(
        micro_batch_size=1, seq_length=8, optimizer="sgd_momentum", activations=False, zero_stage=2
    )
    rows = estimate_memory(LazyCall(LlamaForCausalLM)(**kwargs), layout, zero)
    dense = total - experts
    assert sum(r.optimizer for r in rows) == 4 * (dense + 4 * experts // 2)
    assert sum(r.gradients for r in rows) == 4 * (dense + 4 * experts // 2)
    assert all(r.parameters == 4 * (dense + experts // 2) for r in rows)
