"""Per-rank training memory of a config's layout, before launching it.

python tools/estimate_memory.py configs/gpt2_pretrain.py [--world-size N] [overrides...]
python tools/estimate_memory.py configs/gpt2_pretrain.py train.dist.tensor_parallel_size=2 \\
    train.zero_optimization.enabled=True train.zero_optimization.stage=3 --world-size 8

Overrides use tools/train_net.py's grammar. No process is started: the model is built on
the meta device per (pipeline, tensor-parallel) rank (libai.runtime.memory_estimator).
"""

from __future__ import annotations

import argparse

from libai import dist
from libai.config import LazyConfig
from libai.dist.cli import run_cli
from libai.runtime.memory_estimator import TrainSettings, estimate_config


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def format_table(layout: dist.DistLayout, settings: TrainSettings, rows) -> str:
    """The per-rank table (MiB) with a header naming the layout and switches."""
    head = (
        f"layout pp={layout.pipeline_parallel_size} dp={layout.data_parallel_size} "
        f"tp={layout.tensor_parallel_size} (world {layout.world_size}), "
        f"schedule {layout.pipeline_schedule if layout.pipeline_parallel_size > 1 else '-'}, "
        f"sequence_parallel={layout.sequence_parallel}; ZeRO {settings.zero_stage or 'off'}"
        + (f" (HSDP {settings.hsdp_replicate_size})" if settings.hsdp_replicate_size > 1 else "")
        + f"; amp {settings.amp_dtype or 'off'}; checkpointing {settings.checkpointing or 'off'}; "
        f"optimizer {settings.optimizer}; loss "
        + (f"chunked ({settings.loss_chunk_size})" if settings.loss_chunk_size else "full logits")
        + f"; micro-batch {settings.micro_batch_size} x {settings.seq_length} tokens, "
        f"{settings.num_microbatches} per step"
    )
    cols = [
        "rank",
        "pp",
        "dp",
        "tp",
        "params",
        "grads",
        "optim",
        "act/mb",
        "in flight",
        "act",
        "total",
    ]
    lines = [head, "MiB per rank:", " | ".join(cols)]
    for r in rows:
        cells = [r.rank, r.pp_rank, r.dp_rank, r.tp_rank]
        cells += [
            _mib(x) for x in (r.parameters, r.gradients, r.optimizer, r.activations_micro_batch)
        ]
        cells += [f"{r.in_flight:g}", _mib(r.activations), _mib(r.total)]
        lines.append(" | ".join(str(c) for c in cells))
    return "\n".join(lines)


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
