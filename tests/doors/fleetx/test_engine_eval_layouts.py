"""Evaluation of a zoo model through the Engine on every layout: FleetX's own GPT pretrain
YAML (tests/fixtures/fleetx) on FleetX's corpus format; Engine.evaluate (the loss is the
model's ``lm_loss``) on dp2, tp2 and pp2 equals one process on the same samples, and each
layout really splits the model."""

from __future__ import annotations

import json

import pytest
from engine_helpers import make_engine
from fleetx_files import (
    TINY,
    eval_layout_config,
    fleetx_corpus,
    tokenizer_overrides,
)
from launch import torchrun

#: 12 evaluation samples of 16 tokens: 6 batches of 2 on one process, 3 per rank on dp2
LAYOUTS = {
    "dp2": ["Distributed.dp_degree=2", "Engine.eval_iters=3"],
    "tp2": ["Distributed.mp_degree=2", "Engine.eval_iters=6"],
    "pp2": ["Distributed.pp_degree=2", "Global.micro_batch_size=1", "Engine.eval_iters=6"],
}


def test_engine_evaluate_on_every_layout_equals_one_process(tmp_path):
    data = fleetx_corpus(tmp_path / "data", num_docs=200)
    base = [
        *TINY,
        *tokenizer_overrides(tmp_path / "tok"),
        f"Data.Eval.dataset.input_dir={data}",
        "Data.Eval.dataset.max_seq_len=16",
        "Data.Eval.dataset.split=[4,4,2]",
    ]
    single = make_engine(
        eval_layout_config(base, tmp_path / "one", ["Engine.eval_iters=6"]), mode="eval"
    )
    one = single.evaluate()["loss"]
    one_numel = sum(p.numel() for p in single.runner.model.parameters())
    results = torchrun("engine_eval_layouts.py", 2, json.dumps(base), json.dumps(LAYOUTS))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        for name in LAYOUTS:
            assert r[name]["loss"] == pytest.approx(one, abs=1e-5), (name, r[name], one)
        assert r["dp2"]["local_numel"] == one_numel and r["dp2"]["layers"] == [0, 1]
        assert r["tp2"]["local_numel"] < 0.6 * one_numel  # tp shards (biases, norms stay)
        assert r["pp2"]["layers"] == [rank]  # one layer per stage
