"""Record one training step of the tiny GPT under a parallel layout with ``libai.align``.

Usage: ``align_layouts.py --out DIR --dump ROOT --layout tp2|pp2 [--perturb]``. Every rank
records through hooks while ``ModelRunner`` runs forward and backward, then dumps the report
and parameters under ``ROOT/<layout>/gpt``. With ``--perturb`` the tp rank 1 shard of one
MLP weight is changed, so the comparison must find that module. The test compares the dumps
with a single-process dump (``tests/distributed/test_align_dist.py``).
"""

from __future__ import annotations

import argparse
import os

import torch
from align_reference import build_model, make_batch
from common import parse_out_dir, run_checks
from torch.distributed.tensor import DTensor

from libai import dist
from libai.align import create_model
from libai.runtime.parallel import ModelRunner

LAYOUTS = {
    "tp2": {"tensor_parallel_size": 2},
    "pp2": {"pipeline_parallel_size": 2, "pipeline_num_layers": 4, "pipeline_schedule": "GPipe"},
}
PERTURBED = "GPT_model.transformer.layers.1.mlp.dense_4h_to_h.weight"


def record(root: str, layout: str, perturb: bool) -> dict:
    util = dist.setup_dist_util(dict(LAYOUTS[layout]))
    model = build_model()
    recorder = create_model(model, "gpt")  # before ModelRunner prunes other stages' layers
    runner = ModelRunner(model, num_microbatches=1)
    if perturb:
        p = dict(model.named_parameters())[PERTURBED]
        if util.tensor_parallel_rank == 1:
            with torch.no_grad():
                p.to_local()[0, 0] += 0.05
    runner.forward_backward(make_batch())
    recorder.dump_report(os.path.join(root, layout))
    recorder.dump_params(os.path.join(root, layout))
    recorder.close()
    local = {
        n: list(p.to_local().shape) if isinstance(p, DTensor) else list(p.shape)
        for n, p in model.named_parameters()
    }
    return {"rank": dist.get_rank(), "local_shapes": local, "layout": layout}


def main() -> None:
    out_dir, _, rest = parse_out_dir()
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    parser.add_argument("--perturb", action="store_true")
    args = parser.parse_args(rest)
    run_checks(out_dir, lambda: record(args.dump, args.layout, args.perturb))


if __name__ == "__main__":
    main()
