"""Train a task module from a FleetX-style YAML config (libai.engine.Engine).

python tools/train.py -c projects/simple_net/simple_net.yaml [-o Engine.max_steps=20]
bash tools/train.sh tools/train.py projects/gpt/configs/pretrain_gpt_345M_dp2.yaml 2
"""

from __future__ import annotations

from libai.dist.cli import run_cli
from libai.fleetx.yaml_setup import engine_from_command_line


def main() -> int:
    engine = engine_from_command_line("train", __doc__.splitlines()[0])
    cfg = engine.cfg
    if cfg.Engine.save_load.ckpt_dir:
        engine.load()
    engine.fit()
    return 0


if __name__ == "__main__":
    run_cli(main)
