"""Export a task module's model to ONNX (verified in onnxruntime) from a YAML config.

python tools/export.py -c CONFIG.yaml -o Engine.save_load.ckpt_dir=output/model_final
  [-o Inference.model_dir=DIR]   (default: Engine.save_load.output_dir/export)
"""

from __future__ import annotations

import os
import sys

from libai.config.yaml_config import load_yaml_config
from libai.engine import Engine
from libai.engine.yaml_setup import build_module, run_tool, setup_yaml_run, yaml_argument_parser


def main() -> int:
    args = yaml_argument_parser(__doc__.splitlines()[0]).parse_args()
    sys.path.insert(0, os.getcwd())
    cfg = load_yaml_config(args.config, [*args.override, *args.opts])
    setup_yaml_run(cfg, "export")
    engine = Engine(cfg, build_module(cfg), mode="export")
    if cfg.Engine.save_load.ckpt_dir:
        engine.load()
    checks = engine.export()
    for name, check in checks.items():
        print(
            f"{os.path.join(engine.export_dir(), name)}: max |onnxruntime - torch| "
            f"{check.max_abs_diff:.3g}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    run_tool(main)
