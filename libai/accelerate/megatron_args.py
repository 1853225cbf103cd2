"""Megatron's / Rapidformer's argument names on ``args``: the flags a Rapidformer script or
command spells differently, mapped onto ours (one value, two names), and the attributes its
scripts read (``args.mask_prob``, ``args.dataset_path``, ``args.local_rank``, ...)."""

from __future__ import annotations

import argparse
import os

__all__ = ["ALIASES", "add_megatron_names", "set_megatron_names"]

#: Megatron / Rapidformer attribute -> ours (the same value under both names)
ALIASES = {
    "mask_prob": "mlm_probability",
    "dataset_path": "data_path",
    "dataset_name": "data_name",
}


def add_megatron_names(parser: argparse.ArgumentParser) -> None:
    """``--mask-prob`` / ``--dataset-path`` / ``--dataset-name`` (other spellings of
    ``--mlm-probability`` / ``--data-path`` / ``--data-name``), and Megatron's
    ``--short-seq-prob``, ``--mmap-warmup``, ``--local-rank`` and GPT masking switches."""
    g = parser.add_argument_group("Megatron's names (Rapidformer scripts read them on args)")
    for megatron, ours in ALIASES.items():
        g.add_argument(
            "--" + megatron.replace("_", "-"),
            dest=ours,
            type=float if ours == "mlm_probability" else str,
            default=argparse.SUPPRESS,
            help=f"the same as --{ours.replace('_', '-')}",
        )
    g.add_argument("--short-seq-prob", type=float, default=0.1, help="BERT samples: short pairs")
    g.add_argument("--mmap-warmup", action="store_true", help="read the .bin once at start")
    g.add_argument(
        "--local-rank",
        "--local_rank",
        dest="local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", 0)),
    )
    for flag in ("--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"):
        g.add_argument(flag, action="store_true", help="Megatron's GPT masking switch")


def set_megatron_names(args: argparse.Namespace) -> argparse.Namespace:
    """Put the Megatron names of :data:`ALIASES` on ``args`` (and ``rank`` / ``world_size``
    of the launcher's environment)."""
    for megatron, ours in ALIASES.items():
        setattr(args, megatron, getattr(args, ours, None))
    args.rank = int(os.environ.get("RANK", 0))
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    return args
