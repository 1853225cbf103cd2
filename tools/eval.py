"""Evaluate a task module on Data.Eval (and its test pass on Data.Test) from a YAML config.

python tools/eval.py -c CONFIG.yaml -o Engine.save_load.ckpt_dir=output/model_final
"""

from __future__ import annotations

import os
import sys

from libai.config.yaml_config import load_yaml_config
from libai.engine import Engine
from libai.engine.yaml_setup import build_module, run_tool, setup_yaml_run, yaml_argument_parser
from libai.utils import distributed as dist


def main() -> int:
    args = yaml_argument_parser(__doc__.splitlines()[0]).parse_args()
    sys.path.insert(0, os.getcwd())
    cfg = load_yaml_config(args.config, [*args.override, *args.opts])
    setup_yaml_run(cfg, "eval")
    engine = Engine(cfg, build_module(cfg), mode="eval")
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
    run_tool(main)
