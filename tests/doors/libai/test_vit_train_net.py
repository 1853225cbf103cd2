"""configs/vit_imagenet.py through tools/train_net.py on a tiny generated image folder: the
loss falls, evaluation reports accuracy (also under pp2), and model_best tracks Acc@1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from train_net_helpers import ROOT, read_metrics, run_train_net
from zoo_data import build_image_folder

from libai.config import LazyConfig

CONFIG = str(ROOT / "configs" / "vit_imagenet.py")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """train/ and val/ with 3 classes of noisy 20 x 20 PNGs of one colour each."""
    return build_image_folder(tmp_path_factory.mktemp("images"))


def tiny(root) -> list[str]:
    data = [
        f"dataloader.train.dataset.0.root={root / 'train'}",
        "dataloader.train.dataset.0.image_size=16",
        f"dataloader.train.valid_dataset.root={root / 'val'}",
        "dataloader.train.valid_dataset.image_size=16",
        f"dataloader.test.0.dataset.root={root / 'val'}",
        "dataloader.test.0.dataset.image_size=16",
        "dataloader.train.num_workers=0",
    ]
    model = [
        "model.cfg.img_size=16",
        "model.cfg.patch_size=4",
        "model.cfg.embed_dim=32",
        "model.cfg.depth=2",
        "model.cfg.num_heads=4",
        "model.cfg.num_classes=3",
    ]
    train = [
        "train.train_epoch=0",
        "train.warmup_ratio=0",
        "train.train_micro_batch_size=6",
        "train.test_micro_batch_size=6",
        "train.log_period=1",
        "train.evaluation.eval_iter=2",
        "optim.lr=3e-3",
    ]
    return data + model + train


def train_net(root, out_dir, *overrides, nproc=1):
    return run_train_net(
        CONFIG, [*tiny(root), f"train.output_dir={out_dir}", *overrides], nproc=nproc
    )


def test_vit_trains_and_reports_accuracy(image_folder, tmp_path):
    out = tmp_path / "run"
    proc = train_net(
        image_folder,
        out,
        "train.train_iter=16",
        "train.evaluation.eval_period=8",
        "train.checkpointer.period=8",
    )
    cfg = LazyConfig.load(str(out / "config.yaml"))  # the saved config loads back
    assert cfg.model.cfg.depth == 2 and cfg.train.evaluation.eval_metric == "Acc@1"
    metrics = read_metrics(out)
    losses = [metrics[i]["total_loss"] for i in range(16)]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.2, losses  # ln(3) = 1.10 at start
    acc = [metrics[i]["Acc@1"] for i in sorted(metrics) if "Acc@1" in metrics[i]]
    assert len(acc) == 2 and all(0.0 <= a <= 100.0 for a in acc), acc
    assert "Acc@5" in metrics[15]  # k above the 3 classes is capped: always 100
    assert metrics[15]["Acc@5"] == 100.0
    # model_best follows Acc@1 (a case-insensitive metric name, mode "max")
    assert (out / "model_best" / ".metadata").exists()
    assert "Saved model_best: acc@1" in proc.stdout + proc.stderr


def test_vit_pipeline_parallel_trains_and_evaluates(image_folder, tmp_path):
    out = tmp_path / "pp2"
    train_net(
        image_folder,
        out,
        "train.train_iter=3",
        "train.evaluation.eval_period=3",
        "train.dist.pipeline_parallel_size=2",
        "train.num_accumulation_steps=2",
        nproc=2,
    )
    metrics = read_metrics(out)
    assert all(np.isfinite(metrics[i]["total_loss"]) for i in range(3))
    assert 0.0 <= metrics[2]["Acc@1"] <= 100.0 and metrics[2]["Acc@5"] == 100.0
    assert all(Path(out, "model_final", f"__{r}_0.distcp").exists() for r in range(2))
