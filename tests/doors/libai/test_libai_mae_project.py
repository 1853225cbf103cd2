"""LiBai's own MAE project (tests/fixtures/libai/projects/MAE, LiBai 9dcbe3b2, unmodified)
through LiBai's command, ``bash tools/train.sh projects/MAE/train_net.py
projects/MAE/configs/mae_pretraining.py N``: how far it gets, pinned."""

from __future__ import annotations

import subprocess

import torch
from train_net_helpers import ROOT, TRAIN_SH, train_env

LIBAI_CHECKOUT = ROOT / "tests" / "fixtures" / "libai"


def test_mae_pretraining_stops_at_its_own_numpy_float(tmp_path):
    """LiBai's MAE (tests/fixtures/libai/projects/MAE, unmodified) through LiBai's command:
    its entry script, its config (flowvision's transforms, LiBai's common configs), its
    model's modules (PatchEmbedding, TransformerLayer) all build; it stops where its own
    code calls ``np.float`` (modeling/pos_embed.py), which NumPy removed in 1.24 -- LiBai
    itself stops there on any current NumPy. Pinned: this test goes red when that changes."""
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in ("n01", "n02"):
            folder = tmp_path / "imagenet" / split / label
            folder.mkdir(parents=True)
            for i in range(2):
                pixels = torch.randint(0, 255, (40, 40, 3), generator=rng, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.JPEG")
    root = tmp_path / "imagenet"
    opts = [
        f"dataloader.train.dataset.0.root={root}",
        f"dataloader.train.valid_dataset.root={root}",
        "dataloader.train.num_workers=0",
        "model.img_size=32",
        "model.patch_size=8",
        "model.embed_dim=32",
        "model.depth=2",
        "model.num_heads=2",
        "model.decoder_embed_dim=16",
        "model.decoder_depth=1",
        "model.decoder_num_heads=2",
        "train.train_micro_batch_size=4",
        "train.num_accumulation_steps=1",
        "train.train_epoch=0",
        "train.train_iter=2",
        "train.amp.enabled=False",
        "graph.enabled=False",
        "train.dist.data_parallel_size=1",
        f"train.output_dir={tmp_path / 'out'}",
    ]
    script, config = "projects/MAE/train_net.py", "projects/MAE/configs/mae_pretraining.py"
    proc = subprocess.run(
        ["bash", str(TRAIN_SH), script, config, "1", *opts],
        cwd=LIBAI_CHECKOUT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "modeling/pos_embed.py" in log and "module 'numpy' has no attribute 'float'" in log, log[
        -4000:
    ]
    assert "while instantiating 'model' (_target_=modeling.mae.MaskedAutoencoderViT)" in log
