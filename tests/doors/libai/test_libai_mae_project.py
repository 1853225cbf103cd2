"""LiBai's own MAE project (tests/fixtures/libai/projects/MAE, LiBai 9dcbe3b2, unmodified:
its entry script, pretraining config, MaskedAutoencoderViT, LiBai's common ImageNet data
config through ``get_config``) pretrains with LiBai's command from the checkout's root,

    bash tools/train.sh projects/MAE/train_net.py projects/MAE/configs/mae_pretraining.py N

with overrides for sizes, run length and data paths -- and ``model.mask_ratio=1.0``: every
patch masked, so the loss does not depend on the random masking (a per-rank draw), and two
layouts can be compared. On dp2 every loss equals one process's (fp32).
"""

from __future__ import annotations

import pytest
import torch
from train_net_helpers import ROOT, read_metrics, run_project_script

LIBAI_CHECKOUT = ROOT / "tests" / "fixtures" / "libai"
SCRIPT = "projects/MAE/train_net.py"
CONFIG = "projects/MAE/configs/mae_pretraining.py"


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    """An ImageNet-style folder: train/ and val/, two classes of four 40 x 40 images."""
    from PIL import Image

    root = tmp_path_factory.mktemp("mae_imagenet")
    rng = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in ("n01", "n02"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 255, (40, 40, 3), generator=rng, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.JPEG")
    return root


def overrides(root, out, micro: int, nproc: int) -> list[str]:
    return [
        f"dataloader.train.dataset.0.root={root}",
        "dataloader.train.num_workers=0",
        "dataloader.train.dataset.0.transform.transforms.0.size=[32,32]",
        "model.img_size=32",
        "model.patch_size=8",
        "model.embed_dim=32",
        "model.depth=2",
        "model.num_heads=2",
        "model.decoder_embed_dim=16",
        "model.decoder_depth=1",
        "model.decoder_num_heads=2",
        "model.mask_ratio=1.0",
        f"train.train_micro_batch_size={micro}",
        "train.num_accumulation_steps=1",
        "train.train_epoch=0",
        "train.train_iter=3",
        "train.log_period=1",
        "train.amp.enabled=False",
        "graph.enabled=False",
        f"train.dist.data_parallel_size={nproc}",
        f"train.output_dir={out}",
    ]


def losses(out) -> dict[int, float]:
    return {i: m["total_loss"] for i, m in read_metrics(out).items() if "total_loss" in m}


def test_mae_pretrains_with_libais_command(imagenet, tmp_path):
    out = tmp_path / "run"
    opts = overrides(imagenet, out, 4, 1)
    proc = run_project_script(SCRIPT, CONFIG, opts, cwd=LIBAI_CHECKOUT, launcher="train.sh")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = losses(out)
    assert sorted(got) == [0, 1, 2] and len(set(got.values())) == 3
    assert "MaskedAutoencoderViT(" in proc.stdout + proc.stderr


def test_mae_dp2_equals_one_process(imagenet, tmp_path):
    """The same global batch of 4 (its augmentations drawn per sample, the same on every
    layout): every loss on dp2 equals one process's."""
    runs = {}
    for name, nproc, micro in (("one", 1, 4), ("dp2", 2, 2)):
        out = tmp_path / name
        opts = overrides(imagenet, out, micro, nproc)
        proc = run_project_script(SCRIPT, CONFIG, opts, nproc=nproc, cwd=LIBAI_CHECKOUT)
        assert proc.returncode == 0, proc.stdout[-4000:]
        runs[name] = losses(out)
    assert sorted(runs["one"]) == [0, 1, 2]
    for i, want in runs["one"].items():
        assert runs["dp2"][i] == pytest.approx(want, rel=1e-6), runs
