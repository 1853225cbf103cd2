"""Export a task module's model to ONNX (verified in onnxruntime) from a YAML config.

python tools/export.py -c CONFIG.yaml -o Engine.save_load.ckpt_dir=output/model_final
  [-o Inference.model_dir=DIR]   (writes DIR/rank_0/model.onnx; default DIR: Engine.save_load.output_dir,
  where FleetX's inference YAML reads it with Inference.model_dir: ./output)
"""

from __future__ import annotations

import os

from libai.dist.cli import run_cli
from libai.fleetx.yaml_setup import engine_from_command_line


def main() -> int:
    engine = engine_from_command_line("export", __doc__.splitlines()[0])
    cfg = engine.cfg
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
    run_cli(main)
