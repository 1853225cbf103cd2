"""LiBai's GraphBase drives the runtime's step: on two data-parallel ranks it equals one
process (dist_scripts/graph_base_dp.py)."""

from __future__ import annotations

import torch
from gpt_reference import GRAD_TOL, LR, STEPS, build_model, full_state, make_batch
from launch import torchrun

from libai import dist


def plain_loop() -> dict:
    """One process, the whole batch, written out: forward, backward, SGD with momentum."""
    dist.setup_dist_util({})
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        loss = model(**make_batch(step))["lm_loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return {"lr": LR, "losses": losses, "final": full_state(model)}


def test_graph_base_on_two_data_parallel_ranks_equals_one_process(tmp_path):
    path = tmp_path / "reference.pt"
    torch.save(plain_loop(), path)
    results = torchrun("graph_base_dp.py", 2, str(path))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
        assert result["loss_diff"] <= GRAD_TOL, result["losses"]
        assert result["final_diff"][0] <= GRAD_TOL, result["final_diff"]
    assert results[0]["losses"] == results[1]["losses"]  # the dp mean, on every rank
