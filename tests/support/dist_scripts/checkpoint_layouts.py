"""Sharded checkpoints across layouts (run by tests/unit/checkpoint/test_checkpoint.py on 2 ranks).

``save`` phase: train the tiny GPT (with dropout, AdamW, LambdaLR) on dp2, tp2 and pp2,
save a checkpoint after 2 steps, record the full (gathered) parameters and optimizer state
at save time, then train 2 more steps (the uninterrupted losses). On dp2 also resume in
the same process and compare.

``load`` phase (a second launch): resume dp2 and pp2 from their own checkpoints in a fresh
process (losses must equal the uninterrupted ones bitwise), and load the dp2 checkpoint on
tp2 and pp2, and the pp2 checkpoint on dp2 (values must equal the saved ones exactly).
"""

from __future__ import annotations

import errno
import logging
import os
import sys

import torch
from common import parse_out_dir, run_checks
from gpt_reference import BATCH, SEED, TINY_GPT, make_batch

from libai import dist
from libai.checkpoint import checkpointer as ckpt_mod
from libai.checkpoint.checkpointer import Checkpointer, CheckpointError
from libai.models import GPTForPreTraining
from libai.runtime.amp import DynamicLossScaler
from libai.runtime.parallel import ModelRunner

GPT = dict(TINY_GPT, embedding_dropout_prob=0.1, attention_dropout_prob=0.1)
PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": TINY_GPT["hidden_layers"]}
LAYOUTS = {
    "dp2": ({"data_parallel_size": 2}, 1),
    "tp2": ({"tensor_parallel_size": 2}, 1),
    "pp2": (PP, 2),
}
CANONICAL = "GPT_model.embeddings.token_embeddings.weight"
COPY = "GPT_model.lm_head.weight"
SAVE_STEP = 2  # steps before the checkpoint
TOTAL_STEPS = 4


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


WARNINGS = _Records()  # attached in main()


def setup(layout: str):
    dist_cfg, microbatches = LAYOUTS[layout]
    util = dist.setup_dist_util(dict(dist_cfg))
    torch.manual_seed(SEED)
    model = GPTForPreTraining(**GPT)
    runner = ModelRunner(model, num_microbatches=microbatches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
    scaler = DynamicLossScaler()
    return util, model, runner, optimizer, scheduler, scaler


def train(util, runner, optimizer, scheduler, steps) -> list[float]:
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    losses = []
    for step in steps:
        batch = {k: v.chunk(dp)[rank] for k, v in make_batch(step).items()}
        losses.append(runner.train_step(batch, optimizer))
        scheduler.step()
    return losses


def canonical(name: str) -> str:
    return CANONICAL if name == COPY else name


def full_state(model, optimizer) -> dict[str, torch.Tensor]:
    """This rank's parameters and AdamW moments, gathered over (dp, tp), padding dropped."""
    out = {}
    for name, p in model.named_parameters():
        shape = getattr(p, "libai_logical_shape", None) or tuple(p.shape)
        for key, t in [("param", p)] + [
            (k, v) for k, v in optimizer.state[p].items() if k in ("exp_avg", "exp_avg_sq")
        ]:
            full = dist.ttol(t.detach()).clone()
            out[f"{key}:{name}"] = full[tuple(slice(0, s) for s in shape)]
    return out


def local_numel(model) -> int:
    return sum(
        p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters()
    )


def save_phase(root: str) -> dict:
    result = {}
    for layout in ("dp2", "tp2", "pp2"):
        util, model, runner, optimizer, scheduler, scaler = setup(layout)
        losses = train(util, runner, optimizer, scheduler, range(SAVE_STEP))
        scaler.update(found_inf=True)  # some non-default state to carry over
        ckpt = Checkpointer(
            model,
            os.path.join(root, layout),
            optimizer=optimizer,
            scheduler=scheduler,
            grad_scaler=scaler,
        )
        ckpt.save(
            f"model_{SAVE_STEP - 1:07d}",
            iteration=SAVE_STEP - 1,
            consumed_train_samples=SAVE_STEP * BATCH,
        )
        state = full_state(model, optimizer)
        torch.save(state, os.path.join(root, f"{layout}_state_rank{dist.get_rank()}.pt"))
        losses += train(util, runner, optimizer, scheduler, range(SAVE_STEP, TOTAL_STEPS))
        result[layout] = {
            "losses": losses,
            "params": sorted(n for n, _ in model.named_parameters()),
            "local_numel": local_numel(model),
            "pipeline_rank": util.pipeline_rank,
        }
        if layout == "dp2":  # resume in the same process from a freshly built model
            util, model, runner, optimizer, scheduler, scaler = setup(layout)
            ckpt = Checkpointer(
                model, ckpt.save_dir, optimizer=optimizer, scheduler=scheduler, grad_scaler=scaler
            )
            extra = ckpt.resume_or_load(None, resume=True)
            loaded = full_state(model, optimizer)
            result["dp2_inprocess"] = {
                "extra": extra,
                "state_equal": all(torch.equal(loaded[k], state[k]) for k in state),
                "losses": train(util, runner, optimizer, scheduler, range(SAVE_STEP, TOTAL_STEPS)),
                "scheduler_last_epoch": scheduler.last_epoch,
                "scaler": scaler.state_dict(),
            }
    return result


def compare(loaded: dict, saved: dict) -> dict:
    """Exact comparison of this rank's loaded values with the saved full values."""
    mismatched = [k for k in loaded if not torch.equal(loaded[k], saved[k])]
    return {"compared": sorted(loaded), "mismatched": mismatched}


def saved_state(root: str, layout: str) -> dict[str, torch.Tensor]:
    """The full values at save time of ``layout``'s run, under canonical names."""
    merged = {}
    for rank in range(2):
        for key, value in torch.load(os.path.join(root, f"{layout}_state_rank{rank}.pt")).items():
            kind, name = key.split(":", 1)
            merged.setdefault(f"{kind}:{canonical(name)}", value)
    return merged


def load_phase(root: str) -> dict:
    result = {}
    # same layout, fresh process: resume and continue
    for layout in ("dp2", "pp2"):
        util, model, runner, optimizer, scheduler, scaler = setup(layout)
        ckpt = Checkpointer(
            model,
            os.path.join(root, layout),
            optimizer=optimizer,
            scheduler=scheduler,
            grad_scaler=scaler,
        )
        WARNINGS.messages.clear()
        extra = ckpt.resume_or_load(None, resume=True)
        loaded = {
            f"{k.split(':', 1)[0]}:{canonical(k.split(':', 1)[1])}": v
            for k, v in full_state(model, optimizer).items()
        }
        result[f"{layout}_resume"] = {
            "extra": extra,
            "warnings": list(WARNINGS.messages),
            "scaler": scaler.state_dict(),
            "scheduler_last_epoch": scheduler.last_epoch,
            **compare(loaded, saved_state(root, layout)),
            "losses": train(util, runner, optimizer, scheduler, range(SAVE_STEP, TOTAL_STEPS)),
        }
    # control: the same resume without the RNG states gives other dropout masks
    util, model, runner, optimizer, scheduler, scaler = setup("dp2")
    ckpt = Checkpointer(model, os.path.join(root, "dp2"), optimizer=optimizer, scheduler=scheduler)
    ckpt.load(ckpt.get_checkpoint_file(), checkpointables=["optimizer", "scheduler"])
    result["dp2_resume_without_rng"] = {
        "losses": train(util, runner, optimizer, scheduler, range(SAVE_STEP, TOTAL_STEPS))
    }
    # other layouts: dp2 -> tp2, dp2 -> pp2, pp2 -> dp2
    for source, target in (("dp2", "tp2"), ("dp2", "pp2"), ("pp2", "dp2")):
        util, model, runner, optimizer, scheduler, scaler = setup(target)
        ckpt = Checkpointer(
            model,
            os.path.join(root, f"scratch_{target}"),
            optimizer=optimizer,
            scheduler=scheduler,
            grad_scaler=scaler,
        )
        WARNINGS.messages.clear()
        extra = ckpt.load(os.path.join(root, source, f"model_{SAVE_STEP - 1:07d}"))
        state = full_state(model, optimizer)
        loaded = {
            f"{k.split(':', 1)[0]}:{canonical(k.split(':', 1)[1])}": v for k, v in state.items()
        }
        item = {
            "extra": extra,
            "warnings": list(WARNINGS.messages),
            "scaler": scaler.state_dict(),
            "scheduler_last_epoch": scheduler.last_epoch,
            "params": sorted(n for n, _ in model.named_parameters()),
            **compare(loaded, saved_state(root, source)),
        }
        if f"param:{COPY}" in state:  # the tied copy on the last stage was filled
            item["copy_filled"] = [
                k for k in ("param", "exp_avg", "exp_avg_sq") if f"{k}:{COPY}" in state
            ]
        # the loaded model keeps training on the new layout
        item["losses"] = train(util, runner, optimizer, scheduler, range(SAVE_STEP, TOTAL_STEPS))
        result[f"{source}_to_{target}"] = item
    return result


def failure_phase(root: str) -> dict:
    """A failure on one rank stops every rank with a clear error (no hang, nothing lost)."""
    util, model, runner, optimizer, scheduler, scaler = setup("dp2")
    save_dir = os.path.join(root, "failures")
    ckpt = Checkpointer(model, save_dir, optimizer=optimizer, scheduler=scheduler)
    ckpt.save("model_a", iteration=0)
    result = {}
    # rank 1 cannot write its state file (the disk is full)
    original = ckpt_mod.write_bytes_durable

    def failing_write(path, data):
        if str(path).endswith("rank_1.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return original(path, data)

    ckpt_mod.write_bytes_durable = failing_write
    try:
        ckpt.save("model_b", iteration=1)
        result["save_error"] = None
    except CheckpointError as exc:
        result["save_error"] = str(exc)
    finally:
        ckpt_mod.write_bytes_durable = original
    dist.synchronize()
    result["tmp_left"] = os.path.exists(os.path.join(save_dir, "model_b.tmp"))
    result["last_checkpoint"] = open(os.path.join(save_dir, "last_checkpoint")).read().strip()
    # only rank 1's state file of a checkpoint is corrupt: both ranks refuse it
    if dist.get_rank() == 0:
        with open(os.path.join(save_dir, "model_a", "rank_1.pt"), "wb") as f:
            f.write(b"garbage")
    dist.synchronize()
    try:
        ckpt.resume_or_load(None, resume=True)
        result["load_error"] = None
    except CheckpointError as exc:
        result["load_error"] = str(exc)
    return result


def main():
    out_dir, _, rest = parse_out_dir()
    phase, root = rest[0], rest[1]
    logging.getLogger("libai.checkpoint.checkpointer").addHandler(WARNINGS)

    def checks():
        if phase == "save":
            return save_phase(root)
        return {**load_phase(root), "failures": failure_phase(root)}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    sys.exit(main())
