"""OneFlow's global-tensor calls of LiBai project code (libai.oneflow_api) on 2 ranks, dp2:
a creation function given the stage mesh and an sbp returns this rank's share of the tensor
its arguments describe; ``to_global`` of a DTensor redistributes it (the same global value);
a plain tensor (the runtime's local view) is returned as it is; cross entropy is the mean
over the global batch. Run by
tests/distributed/test_oneflow_api_placements.py."""

from __future__ import annotations

import torch
from common import parse_out_dir, run_checks
from torch.distributed.tensor import DTensor, distribute_tensor

from libai import dist
from libai.oneflow_api import project_module


def checks() -> dict:
    dist.setup_dist_util({"data_parallel_size": 2})
    flow = project_module("oneflow")
    rank = dist.get_rank()
    mesh = dist.get_layer_placement(0)  # the dp mesh of 2 ranks
    whole = torch.arange(12.0).view(4, 3)

    split = flow.tensor(whole.tolist(), sbp=[flow.sbp.split(0)], placement=mesh)
    assert torch.equal(split, whole[2 * rank : 2 * rank + 2]), split
    cols = flow.arange(
        6, sbp=dist.get_nd_sbp([flow.sbp.split(0), flow.sbp.broadcast]), placement=mesh
    )
    assert cols.tolist() == list(range(3 * rank, 3 * rank + 3)), cols
    same = flow.ones(2, 3, sbp=[flow.sbp.broadcast], placement=mesh)
    assert torch.equal(same, torch.ones(2, 3))

    shard = distribute_tensor(whole, mesh, [flow.sbp.split(0)])
    full = shard.to_global(sbp=[flow.sbp.broadcast])
    assert isinstance(full, DTensor) and torch.equal(full.to_local(), whole)
    assert full.sbp == (flow.sbp.broadcast,) and full.placement is mesh and full.is_global
    back = full.to_global(placement=mesh, sbp=[flow.sbp.split(1)])
    assert torch.equal(back.to_local(), whole[:, rank * 2 : rank * 2 + 2][:, : 3 - rank * 2])
    local = torch.full((2,), float(rank))
    assert local.to_global(sbp=[flow.sbp.broadcast], placement=mesh) is local
    assert local.sbp == (flow.sbp.broadcast,) and not local.is_global

    # cross entropy over a batch split across ranks, rank 0 counting 3 targets and rank 1
    # one: the ranks' average is the mean over all 4 (OneFlow's global mean), its gradient
    # the one-process gradient
    logits = torch.randn(8, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    target = torch.tensor([1, 0, 4, 2, 0, 0, 3, 0])  # 0 ignored, as LiBai's Llama loss
    mine = logits[4 * rank : 4 * rank + 4]
    local = flow._C.cross_entropy(mine, target[4 * rank : 4 * rank + 4], ignore_index=0)
    average = local.detach().clone()
    torch.distributed.all_reduce(average)
    whole = torch.nn.functional.cross_entropy(logits, target, ignore_index=0)
    assert torch.allclose(average / 2, whole), (average / 2, whole)
    (local / 2).backward()  # the runtime averages over the dp ranks
    grad = logits.grad.clone()
    torch.distributed.all_reduce(grad)
    want = torch.autograd.grad(whole, logits)[0]
    assert torch.allclose(grad, want, atol=1e-7), (grad, want)
    loss_fn = flow.nn.CrossEntropyLoss(ignore_index=0)
    assert torch.equal(loss_fn(mine, target[4 * rank : 4 * rank + 4]).detach(), local.detach())
    return {"rank": rank}


if __name__ == "__main__":
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, checks)
