"""FleetX's own MoE files (tests/fixtures/fleetx, byte for byte: ``pretrain_moe_base.yaml``
and ``pretrain_moe_1.3B_dp8.yaml`` with its ``_base_``) through ``Model.module: MoEModule``:

- both run through tools/train.py with size / steps / data / device overrides only, and log
  the balancing loss as its own term and every departure from FleetX in one line;
- the dp8 file on dp2 (2 experts per rank, 4 in all, split over the two ranks) equals one
  process holding the same 4 experts on the same global batches, step by step;
- the gates (naive, gshard, switch) equal FleetX's formulas written out per token here
  (raw top-k logits as weights, ExpertLayer = Linear + tanh-GELU + Linear with biases, the
  gate a Linear with bias, gshard's ``E * sum c_e m_e`` and switch's loss, averaged over the
  layers and weighted by ``Engine.balance_loss_weight``);
- bad MoE settings are one-line errors.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import run_tool
from fleetx_files import TINY, fleetx_corpus, tokenizer_overrides
from fleetx_reference import FLEETX
from train_net_helpers import read_metrics

from libai import dist
from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config, resolve_batch_config
from libai.fleetx.yaml_setup import resolve_module_class
from libai.layers import MoE

MOE_DIR = FLEETX / "ppfleetx/configs/nlp/moe"
DP8 = MOE_DIR / "pretrain_moe_1.3B_dp8.yaml"
BASE = MOE_DIR / "pretrain_moe_base.yaml"
#: the base file has no model sizes (the 1.3B file adds them): added, as sizes
BASE_SIZES = [
    "+Model.vocab_size=512",
    "+Model.hidden_size=32",
    "+Model.num_layers=2",
    "+Model.num_attention_heads=2",
    "+Model.ffn_hidden_size=64",
    "+Model.max_position_embeddings=64",
    "+Model.hidden_dropout_prob=0.0",
    "+Model.attention_probs_dropout_prob=0.0",
    "Global.device=cpu",
    "Engine.mix_precision.enable=false",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleetx_moe")
    corpus = fleetx_corpus(root / "data", num_docs=300)
    return [
        *tokenizer_overrides(root / "tok"),
        f"Data.Train.dataset.input_dir={corpus}",
        f"Data.Eval.dataset.input_dir={corpus}",
        "Data.Train.dataset.max_seq_len=16",
        "Data.Eval.dataset.max_seq_len=16",
        "Engine.logging_freq=1",
        "Engine.eval_freq=-1",
        "Engine.save_load.save_steps=1000",
    ]


def _run(config, out, *overrides, nproc=1):
    proc = run_tool(
        "train",
        config,
        *overrides,
        f"Engine.save_load.output_dir={out}",
        nproc=nproc,
    )
    return proc.stdout, read_metrics(out)


def test_both_files_run_through_tools_train(data, tmp_path):
    log, metrics = _run(
        DP8, tmp_path / "dp8", *TINY, *data, "Engine.max_steps=3", "Distributed.dp_degree=1"
    )
    assert sorted(metrics) == [0, 1, 2]
    # 2 experts, top-2: every token takes both, FleetX's gshard loss is exactly 2 per layer,
    # averaged over the layers, x balance_loss_weight 1.0
    assert all(m["moe_aux_loss"] == pytest.approx(2.0, abs=1e-6) for m in metrics.values())
    assert "MoEModule (gate gshard, top_k 2): 2 experts per data-parallel rank" in log
    assert "Distributed.hcg='HybridCommGroupForMoE' has no effect here" in log
    log, metrics = _run(BASE, tmp_path / "base", *BASE_SIZES, *data, "Engine.max_steps=2")
    assert sorted(metrics) == [0, 1] and all("moe_aux_loss" in m for m in metrics.values())


def test_dp2_equals_one_process_with_the_same_experts(data, tmp_path):
    """dp2: FleetX's 2 experts per rank are 4 experts split over the 2 ranks; one process
    with num_experts 4 holds the same model. A learning rate that moves the weights, so the
    later steps compare the gradients too."""
    common = [
        *TINY,
        *data,
        "Engine.max_steps=4",
        "Optimizer.lr.max_lr=0.05",
        "Optimizer.lr.min_lr=0.05",
        "Optimizer.lr.warmup_rate=0.0",
        "Global.local_batch_size=2",
        "Global.micro_batch_size=2",
    ]
    log, dp2 = _run(DP8, tmp_path / "dp2", *common, "Distributed.dp_degree=2", nproc=2)
    assert "4 experts, 2 on each rank (expert_parallel_size=2)" in log
    one_process = [
        *common,
        "Distributed.dp_degree=1",
        "Global.local_batch_size=4",
        "Global.micro_batch_size=4",
        "Model.moe_configs.num_experts=4",
    ]
    _, one = _run(DP8, tmp_path / "one", *one_process)
    assert sorted(dp2) == sorted(one) == [0, 1, 2, 3]
    for step in one:
        for key in ("total_loss", "lm_loss", "moe_aux_loss"):
            assert dp2[step][key] == pytest.approx(one[step][key], abs=1e-5), (step, key)
    assert one[3]["lm_loss"] != pytest.approx(one[0]["lm_loss"], abs=1e-3)  # it trained


# ---- the gates against FleetX's formulas --------------------------------------------------------
def _module(gate: str, top_k: int, num_experts: int = 4, weight: float = 0.5):
    cfg = load_yaml_config(
        DP8,
        [
            *TINY,
            "Distributed.dp_degree=1",
            f"Model.moe_configs.gate={gate}",
            f"Model.moe_configs.top_k={top_k}",
            f"Model.moe_configs.num_experts={num_experts}",
            f"Engine.balance_loss_weight={weight}",
            "Model.vocab_size=64",
        ],
    )
    resolve_batch_config(cfg, 1)
    dist.setup_dist_util({})
    torch.manual_seed(0)
    module = resolve_module_class(cfg.Model.module)(cfg)
    with torch.no_grad():  # biases away from their zero init, so a missing one shows
        for name, p in module.model.named_parameters():
            if "router.bias" in name or ".b_up" in name or ".b_down" in name:
                p.normal_(std=0.5)
    return module


def _fleetx_layer(moe: MoE, x: torch.Tensor, gate: str, top_k: int):
    """FleetX's MoELayer on tokens ``x [T, H]`` written out per token: ``(output, loss)``."""
    w, b = moe.router.weight, moe.router.bias
    logits = x @ w.t() + b  # NaiveGate: nn.Linear
    e = moe.experts

    def expert(i, t):  # ExpertLayer: htoh4, gelu(approximate=True), h4toh
        h = F.gelu(x[t] @ e.w_up[i].t() + e.b_up[i], approximate="tanh")
        return h @ e.w_down[i].t() + e.b_down[i]

    E, T = logits.shape[1], logits.shape[0]
    out = torch.zeros_like(x)
    if gate == "switch":
        score = logits.softmax(-1)
        value, idx = score.topk(1, dim=-1)
    else:
        value, idx = logits.topk(top_k, dim=-1)  # the raw logits weigh the outputs
    for t in range(T):
        for j in range(idx.shape[1]):
            out[t] = out[t] + value[t, j] * expert(int(idx[t, j]), t)
    if gate == "gshard":  # c_e: share of all top-k assignments; m_e: mean softmax
        c = torch.zeros(E).scatter_add(0, idx.flatten(), torch.ones(idx.numel())) / T
        m = logits.softmax(-1).mean(0)
        loss = (c * m).mean() * E**2
    elif gate == "switch":
        frac = torch.zeros(E).scatter_add(0, idx.flatten(), torch.ones(T)) / T
        prob = score.sum(0) / T
        loss = (frac * prob).sum() * E
    else:
        loss = torch.zeros(())
    return out, loss


@pytest.mark.parametrize(("gate", "top_k"), [("naive", 2), ("gshard", 2), ("switch", 1)])
def test_gates_equal_fleetx_formulas(gate, top_k):
    module = _module(gate, top_k)
    layers = [m for m in module.model.modules() if isinstance(m, MoE)]
    assert len(layers) == 2  # expert_mode: every block
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    losses = []
    for moe in layers:
        moe.train()
        got = moe(x)
        want, loss = _fleetx_layer(moe, x.reshape(-1, 32), gate, top_k)
        torch.testing.assert_close(got.reshape(-1, 32), want, atol=1e-5, rtol=1e-5)
        losses.append(float(moe.last_losses.get("moe_aux_loss", torch.zeros(()))))
        want_term = 0.5 * float(loss) / len(layers)  # weight x mean over the layers
        assert math.isclose(losses[-1], want_term, rel_tol=1e-5, abs_tol=1e-7), (gate, losses)
    if gate != "naive":
        assert sum(losses) > 0


def test_bad_moe_settings_are_one_line_errors():
    with pytest.raises(YAMLConfigError, match=r"Model.moe_configs.gate='top2': FleetX's gates"):
        _module("top2", 2)
    with pytest.raises(YAMLConfigError, match=r"top_k=1: FleetX's gshard gate takes top_k 2"):
        _module("gshard", 1)
    with pytest.raises(YAMLConfigError, match=r"unknown key\(s\) Model.moe_configs.capacity"):
        cfg = load_yaml_config(
            DP8, [*TINY, "Distributed.dp_degree=1", "+Model.moe_configs.capacity=2"]
        )
        resolve_batch_config(cfg, 1)
        from libai.fleetx.modules.moe import fleetx_moe_settings

        fleetx_moe_settings(cfg)
    with pytest.raises(
        YAMLConfigError,
        match=r"Distributed.ep_degree=4: FleetX's expert_mode places the experts over the 2 "
        r"data-parallel ranks; leave ep_degree unset",
    ):
        overrides = [*TINY, "Distributed.dp_degree=2", "Distributed.ep_degree=4"]
        resolve_batch_config(load_yaml_config(DP8, overrides), 2)
