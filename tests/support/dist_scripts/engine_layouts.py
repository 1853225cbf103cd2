"""The FleetX Engine on 2 ranks with SimpleNet (a plain nn.Module): data parallel, and ZeRO
stages 1-3 through Distributed.sharding. Per run: the losses of every step, the evaluation
loss, and what this rank holds (door_memory.holdings: optimizer state, gradients when the
optimizer steps, parameters)."""

from __future__ import annotations

import json
from pathlib import Path

from common import parse_out_dir, run_checks
from door_memory import holdings, probe_step
from engine_helpers import make_engine, simple_cfg


def run(out_dir: Path, name: str, overrides: list[str]) -> dict:
    cfg = simple_cfg(out_dir / name, "Model.dropout=0.0", "Engine.eval_freq=-1", *overrides)
    engine = make_engine(cfg)
    record = probe_step(engine.optimizer, engine.runner.model)
    engine.fit()
    history = engine.trainer.storage.history("total_loss").values()
    return {
        "losses": [v for v, _ in history],
        "eval": engine.evaluate()["loss"],
        **holdings(engine.optimizer, engine.runner.model, record),
    }


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])
    run_checks(out_dir, lambda: {name: run(out_dir, name, o) for name, o in layouts.items()})


if __name__ == "__main__":
    main()
