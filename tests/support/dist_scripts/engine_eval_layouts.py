"""Engine.evaluate of a zoo GPT from FleetX's own pretrain YAML, on FleetX's corpus format,
under several 2-rank layouts in one launch (dp2, tp2, pp2). Per layout: the evaluation
loss (the model's ``lm_loss``), the batches scored, and what this rank holds (its local
parameter elements and pipeline layers)."""

from __future__ import annotations

import json
from pathlib import Path

from common import parse_out_dir, run_checks
from engine_helpers import make_engine
from fleetx_files import eval_layout_config
from torch.distributed.tensor import DTensor


def run(base: list[str], out_dir: Path, name: str, overrides: list[str]) -> dict:
    engine = make_engine(eval_layout_config(base, out_dir / name, overrides), mode="eval")
    model = engine.runner.model
    gpt = model.GPT_model
    return {
        "loss": engine.evaluate()["loss"],
        "local_numel": sum(
            p.to_local().numel() if isinstance(p, DTensor) else p.numel()
            for p in model.parameters()
        ),
        "layers": sorted(int(k) for k in gpt.transformer.layers.keys()),
    }


def main():
    out_dir, _, rest = parse_out_dir()
    base, layouts = json.loads(rest[0]), json.loads(rest[1])
    run_checks(out_dir, lambda: {n: run(base, out_dir, n, o) for n, o in layouts.items()})


if __name__ == "__main__":
    main()
