"""``ParallelCrossEntropyLoss`` over data parallel on unequal valid-token counts.

Run by ``tests/distributed/test_parallel_heads_more.py`` as ``torchrun --nproc_per_node=2``
(dp=2, tp=1). Every rank builds the same global batch (seeded) and takes its half; it reports
its losses with and without ``over_data_parallel`` and, as the reference, the plain
``F.cross_entropy`` of its half and of the whole global batch (one process's loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import parse_out_dir, run_checks

from libai import dist
from libai.layers import ParallelCrossEntropyLoss

VOCAB = 7
#: name -> the two ranks' targets (-100 = ignored): unequal counts of valid tokens
CASES = {
    "3-and-1": [[0, 6, -100, 3], [-100, 2, -100, -100]],
    "0-and-1": [[-100, -100, -100, -100], [-100, -100, 5, -100]],
}


def checks() -> dict:
    dist.setup_dist_util({})
    util = dist.get_dist_util()
    rank = util.data_parallel_rank
    out = {"dp": util.layout.data_parallel_size}
    loss_fn = ParallelCrossEntropyLoss()
    for name, targets in CASES.items():
        target = torch.tensor(targets)  # [dp, 4]
        logits = 3 * torch.randn(2, 4, VOCAB, generator=torch.Generator().manual_seed(1))
        mine = logits[rank].clone().requires_grad_()
        over_dp = loss_fn(mine, target[rank], over_data_parallel=True)
        over_dp.backward()
        whole = logits.clone().requires_grad_()  # one process on the global batch
        want_global = F.cross_entropy(whole.view(-1, VOCAB), target.view(-1))
        want_global.backward()
        has_valid = bool((target[rank] != -100).any())
        out[name] = {
            "over_dp": over_dp.item(),
            "local": loss_fn(mine.detach(), target[rank]).item(),
            # a rank without valid tokens contributes 0 (F.cross_entropy's mean would be nan)
            "want_local": F.cross_entropy(mine.detach(), target[rank]).item() if has_valid else 0.0,
            "want_global": want_global.item(),
            "grad": mine.grad.tolist(),
            # the runtime averages the ranks' gradients: rank r holds dp x its share
            "want_grad": (util.layout.data_parallel_size * whole.grad[rank]).tolist(),
        }
    return out


def main() -> None:
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
