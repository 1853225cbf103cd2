"""Train a task module from a FleetX-style YAML config (libai.engine.Engine).

python tools/train.py -c projects/simple_net/simple_net.yaml [-o Engine.max_steps=20]
bash tools/train.sh tools/train.py projects/gpt/configs/pretrain_gpt_345M_dp2.yaml 2
"""

from __future__ import annotations

import os
import sys

from libai.config.yaml_config import load_yaml_config
from libai.engine import Engine
from libai.engine.yaml_setup import build_module, run_tool, setup_yaml_run, yaml_argument_parser


def main() -> int:
    args = yaml_argument_parser(__doc__.splitlines()[0]).parse_args()
    sys.path.insert(0, os.getcwd())  # a user's own modules and datasets, by dotted path
    cfg = load_yaml_config(args.config, [*args.override, *args.opts])
    setup_yaml_run(cfg, "train")
    engine = Engine(cfg, build_module(cfg), mode="train")
    if cfg.Engine.save_load.ckpt_dir:
        engine.load()
    engine.fit()
    return 0


if __name__ == "__main__":
    run_tool(main)
