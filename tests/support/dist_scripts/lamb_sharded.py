"""LAMB (``libai.optim.oneflow_optim.LAMB``) on DTensor parameters over 2 ranks (tp mesh):
a parameter sharded by rows, one sharded by columns and a replicated one, stepped with the
gradients the test saved; each rank reports the full parameters after the steps and the
shape of its local shard. The test compares them with the LAMB formula on whole tensors."""

from __future__ import annotations

import torch
from common import parse_out_dir, run_checks
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from libai import dist
from libai.optim.oneflow_optim import LAMB

PLACEMENTS = {"rows": Shard(0), "cols": Shard(1), "replicated": Replicate()}


def main():
    out_dir, _, rest = parse_out_dir()
    saved = torch.load(rest[0])

    def checks():
        util = dist.setup_dist_util({"tensor_parallel_size": 2})
        mesh = util.mesh["tp"]
        params, local_shapes = {}, {}
        for name, case in saved["cases"].items():
            placement = [PLACEMENTS[name]]
            p = nn.Parameter(distribute_tensor(case["start"].clone(), mesh, placement))
            opt = LAMB([p], **saved["kwargs"])
            for g in case["grads"]:
                p.grad = distribute_tensor(g.clone(), mesh, placement)
                opt.step()
            local_shapes[name] = list(p.to_local().shape)
            params[name] = p.detach().full_tensor().tolist()
        return {"params": params, "local_shapes": local_shapes}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
