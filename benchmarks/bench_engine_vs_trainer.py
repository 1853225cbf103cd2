"""The FleetX front door costs nothing: an Engine training step against a DefaultTrainer
step on the same GPT, data and layout (one process).

Both doors are built in one process from the same values: ``tools/train_net.py``'s LiBai
config (``configs/gpt2_pretrain.py``) and the Engine's YAML (projects/gpt, ``GPTModule``)
with matching overrides. Each is driven one full loop iteration at a time (``before_step``,
``run_step``, ``after_step``: every hook, writer and, for the Engine, the task module's
``pretreating_batch`` and ``training_step_end``), timed in interleaved blocks (A B, B A, ...)
by the shared harness; both read the same batches, and their losses are checked to be
equal. Target: Engine step / DefaultTrainer step <= 1.02.

    python benchmarks/bench_engine_vs_trainer.py            # the README's GPT, ~1.5 min
    python benchmarks/bench_engine_vs_trainer.py --tiny     # hooks and Python dominate
    python benchmarks/bench_engine_vs_trainer.py --tiny --strict   # exit 1 if missed
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import types
from pathlib import Path

import torch
from harness import Contender, block_pair_ratios, print_step_table, run_interleaved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libai.config import LazyConfig  # noqa: E402
from libai.engine import DefaultTrainer, Engine, default_setup  # noqa: E402
from libai.fleetx.yaml_config import load_yaml_config  # noqa: E402
from libai.fleetx.yaml_setup import build_module, setup_yaml_run  # noqa: E402
from libai.utils.events import EventStorage  # noqa: E402

TARGET_RATIO = 1.02
FAR = 10**6  # a step count no timed run reaches: no final checkpoint, no end-of-run hooks


def shapes(tiny: bool) -> dict:
    if tiny:
        return dict(layers=2, hidden=32, heads=2, ffn=64, seq=32, batch=4)
    return dict(layers=4, hidden=192, heads=4, ffn=768, seq=128, batch=8)


def libai_trainer(s: dict, out: str) -> DefaultTrainer:
    cfg = LazyConfig.load(str(ROOT / "configs" / "gpt2_pretrain.py"))
    overrides = [
        f"model.cfg.hidden_layers={s['layers']}",
        f"model.cfg.hidden_size={s['hidden']}",
        f"model.cfg.num_attention_heads={s['heads']}",
        f"model.cfg.ffn_hidden_size={s['ffn']}",
        f"model.cfg.max_seq_length={s['seq']}",
        f"dataloader.train.dataset.0.max_seq_length={s['seq']}",
        f"train.train_micro_batch_size={s['batch']}",
        f"train.train_iter={FAR}",
        "train.log_period=10",
        "train.evaluation.enabled=false",
        f"train.checkpointer.period={FAR}",
        f"train.output_dir={out}",
    ]
    cfg = LazyConfig.apply_overrides(cfg, overrides)
    args = types.SimpleNamespace(fast_dev_run=False, resume=False)
    default_setup(cfg, args)
    return DefaultTrainer(cfg)


def engine_trainer(s: dict, out: str):
    cfg = load_yaml_config(
        ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml",
        [
            "Global.device=cpu",
            f"Model.hidden_layers={s['layers']}",
            f"Model.hidden_size={s['hidden']}",
            f"Model.num_attention_heads={s['heads']}",
            f"Model.ffn_hidden_size={s['ffn']}",
            f"Model.max_seq_length={s['seq']}",
            "Model.embedding_dropout_prob=0.0",
            "Model.attention_dropout_prob=0.0",
            "Model.output_dropout_prob=0.0",
            f"Global.local_batch_size={s['batch']}",
            "Global.micro_batch_size=null",
            f"Engine.max_steps={FAR}",
            "Engine.logging_freq=10",
            "Engine.eval_freq=-1",
            "Engine.mix_precision.enable=false",
            f"Engine.save_load.save_steps={FAR}",
            f"Engine.save_load.output_dir={out}",
            "Optimizer.name=AdamW",
            "~Optimizer.lr",
            "+Optimizer.lr={name: WarmupCosineLR, learning_rate: 2e-3, warmup_factor: 0.001, "
            "alpha: 0.01, warmup_ratio: 0.05}",
        ],
    )
    setup_yaml_run(cfg)
    engine = Engine(cfg, build_module(cfg))
    return engine.build_trainer()


class Driver:
    """One loop iteration of ``trainer`` per call (all its hooks), in its own storage."""

    def __init__(self, trainer, max_iter: int):
        self.trainer, self.iter = trainer, 0
        trainer.start_iter, trainer.max_iter = 0, max_iter
        self.storage = EventStorage(0)
        trainer.storage = self.storage
        with self.storage:
            trainer.before_train()

    def __call__(self, batch, optimizer) -> float:
        t = self.trainer
        with self.storage:
            t.iter = self.iter
            t.before_step()
            t.run_step()
            t.after_step()
        self.iter += 1
        return self.storage.history("total_loss").latest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="steps per block")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args()
    s = shapes(args.tiny)
    steps = args.steps or (20 if args.tiny else 5)
    total = 3 + steps * args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        trainer = libai_trainer(s, f"{tmp}/libai")
        engine = engine_trainer(s, f"{tmp}/engine")
        contenders = [
            Contender("DefaultTrainer", Driver(trainer, FAR), trainer.optimizer),
            Contender("Engine", Driver(engine, FAR), engine.optimizer),
        ]
        run_interleaved(contenders, [None], warmup=3, repeats=args.repeats, steps=steps)
    a, b = contenders
    # the same batches and weights: the same losses, step for step (same order of steps)
    assert a.losses == b.losses, (a.losses[:5], b.losses[:5])
    print(
        f"\nGPT {s['layers']} layers, hidden {s['hidden']}, seq {s['seq']}, batch {s['batch']}; "
        f"{total} steps each; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    tokens = s["seq"] * s["batch"]
    print_step_table(contenders, tokens)
    ratios = block_pair_ratios(b, a, steps)
    ratio = statistics.median(ratios)
    print(
        f"\nEngine / DefaultTrainer step time: {ratio:.3f} (median of {len(ratios)} block "
        f"pairs; range {ratios[0]:.3f}-{ratios[-1]:.3f}); target <= {TARGET_RATIO}"
    )
    met = ratio <= TARGET_RATIO
    print("target met" if met else "target MISSED")
    return 0 if met or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
