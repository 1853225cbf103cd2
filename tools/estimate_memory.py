"""Per-rank training memory of a config's layout, before launching it.

python tools/estimate_memory.py configs/gpt2_pretrain.py [--world-size N] [overrides...]
python tools/estimate_memory.py configs/gpt2_pretrain.py train.dist.tensor_parallel_size=2 \\
    train.zero_optimization.enabled=True train.zero_optimization.stage=3 --world-size 8

Overrides use tools/train_net.py's grammar. No process is started: the model is built on
the meta device per (pipeline, tensor-parallel) rank (libai.utils.memory_estimator).
"""

from __future__ import annotations

import argparse

from libai.config import LazyConfig
from libai.utils.cli import run_cli
from libai.utils.memory_estimator import estimate_config, format_table


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_file", metavar="CONFIG")
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes of the launch (default: data_parallel_size or 1, times tp x pp)",
    )
    parser.add_argument(
        "--seq-length", type=int, default=None, help="tokens per sample (max_seq_length)"
    )
    parser.add_argument(
        "--no-activations",
        action="store_true",
        help="parameters, gradients and optimizer state only (e.g. BERT, T5: models the "
        "activation formulas do not cover)",
    )
    parser.add_argument("opts", nargs="*", help="config overrides (key=value)")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = LazyConfig.apply_overrides(LazyConfig.load(args.config_file), args.opts)
    layout, settings, rows = estimate_config(
        cfg, args.world_size, args.seq_length, activations=not args.no_activations
    )
    print(format_table(layout, settings, rows), flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
