"""Evaluate a task module on Data.Eval (and its test pass on Data.Test) from a YAML config.

python tools/eval.py -c CONFIG.yaml -o Engine.save_load.ckpt_dir=output/model_final
"""

from __future__ import annotations

from libai import dist
from libai.dist.cli import run_cli
from libai.fleetx.yaml_setup import engine_from_command_line


def main() -> int:
    engine = engine_from_command_line("eval", __doc__.splitlines()[0])
    cfg = engine.cfg
    if cfg.Engine.save_load.ckpt_dir:
        engine.load()
    results = {}
    if engine.valid_loader is not None:
        results["eval"] = engine.evaluate()
    if engine.test_loader is not None:
        results["test"] = engine.predict()
    if not results:
        raise ValueError("nothing to evaluate: the config has no Data.Eval or Data.Test section")
    if dist.is_main_process():
        for split, values in results.items():
            print(split, " ".join(f"{k}={v:.6g}" for k, v in values.items()), flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
