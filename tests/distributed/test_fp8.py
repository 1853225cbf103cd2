"""FP8 training (``train.amp.fp8``, emulated on the CPU) on two data-parallel ranks, plain,
with ZeRO-1 and with ZeRO-3 (FSDP2), against one process running the same two micro-batches
(the scales are taken per micro-batch, so that is the run dp2 must equal)."""

from __future__ import annotations

import json

import pytest
import torch
from fp8_cases import batch_of, build, train
from launch import torchrun

from libai import dist

LAYOUTS = [{"fp8": "tensorwise"}, {"fp8": "rowwise", "zero": 1}, {"fp8": "tensorwise", "zero": 3}]


def _single_process(fp8: str) -> dict:
    dist.setup_dist_util({})
    parts, optimizer = build(fp8, microbatches=2)
    first_loss = float(parts.runner.forward_backward(batch_of(0)))
    grads = {n: p.grad.clone() for n, p in parts.runner.model.named_parameters()}
    parts, optimizer = build(fp8, microbatches=2)
    return {"first_loss": first_loss, "grads": grads, "losses": train(parts, optimizer, 3)}


def test_fp8_on_dp2_zero1_and_zero3_equals_one_process_on_the_same_micro_batches():
    """Loss and every gradient of the first step equal the one-process run (fp32 parameters,
    float8 matmuls emulated) within 1e-5; three steps' losses too. Layout: both ranks run
    the same 8 Linear layers in float8 (query_key_value, dense, dense_h_to_4h,
    dense_4h_to_h of both blocks); under ZeRO-3 each rank holds half of the parameters
    (the float8 casts take the all-gathered weight; float8 all-gather is not used)."""
    ranks = torchrun("fp8_layouts.py", 2, json.dumps(LAYOUTS))
    singles = [_single_process(layout["fp8"]) for layout in LAYOUTS]
    for rank in ranks:
        assert rank["ok"], rank.get("trace")
        for got, want in zip(rank["layouts"], singles):
            assert got["first_loss"] == pytest.approx(want["first_loss"], rel=1e-6)
            assert set(got["grads"]) == set(want["grads"])
            for name, grad in want["grads"].items():
                torch.testing.assert_close(
                    torch.tensor(got["grads"][name]), grad, rtol=1e-5, atol=1e-6, msg=name
                )
            assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
            assert len(got["fp8_layers"]) == 8, got["fp8_layers"]
            assert all("layers." in n for n in got["fp8_layers"])
        shares = [layout["param_share"] for layout in rank["layouts"]]
        assert shares[:2] == [1.0, 1.0] and shares[2] == pytest.approx(0.5, abs=0.02)
