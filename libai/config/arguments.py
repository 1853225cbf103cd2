"""LiBai's command line for training scripts (``from libai.config import
default_argument_parser``; also ``libai.engine.default_argument_parser``)."""

from __future__ import annotations

import argparse

__all__ = ["default_argument_parser"]


def default_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """``--config-file``, ``--resume``, ``--eval-only``, ``--fast-dev-run`` and overrides."""
    parser = argparse.ArgumentParser(
        epilog=epilog
        or "Example: bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py 2 "
        "train.dist.tensor_parallel_size=2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-file", required=True, metavar="FILE", help="path to config file")
    parser.add_argument(
        "--resume", action="store_true", help="resume from the last checkpoint in output_dir"
    )
    parser.add_argument("--eval-only", action="store_true", help="evaluate the loaded weights only")
    parser.add_argument(
        "--fast-dev-run",
        action="store_true",
        help="a few iterations with frequent logging, evaluation and checkpoints (smoke test)",
    )
    parser.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="config overrides in Hydra's grammar, e.g. train.train_iter=100",
    )
    return parser
