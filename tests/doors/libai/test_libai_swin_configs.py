"""LiBai's own Swin configs (tests/fixtures/libai/configs/swin_imagenet.py and
swinv2_cifar100.py, LiBai at 9dcbe3b2, unmodified) through tools/train_net.py on tiny fake
ImageNet / CIFAR-100 files, with overrides only for sizes, run length and data paths --
and, for the 1-vs-2-process comparisons, Mixup's per-rank draws and bf16 off (see
test_libai_vision_configs.SAME_ON_ANY_LAYOUT). The models' numbers against transformers'
Swin / Swinv2 are tests/unit/models/test_swin.py's."""

from __future__ import annotations

import pytest
from train_net_helpers import ROOT, read_metrics, run_train_net
from vision_files import write_cifar100, write_imagenet

CONFIGS = ROOT / "tests" / "fixtures" / "libai" / "configs"
TRAIN_T = "dataloader.train.dataset.0.transform.transforms"
TEST_T = "dataloader.test.0.dataset.transform.transforms"
NUM_CLASSES = 8
#: per-rank randomness off for the 1-vs-2-process comparisons: Mixup's draws on each rank's
#: local batch, and stochastic depth's masks (drawn per rank, like dropout's); fp32
SAME_ON_ANY_LAYOUT = [
    "dataloader.train.mixup_func.prob=0.0",
    "model.cfg.drop_path_rate=0.0",
    "train.amp.enabled=False",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("swin_data")
    return {"imagenet": write_imagenet(root / "imagenet"), "cifar": write_cifar100(root / "cifar")}


def crop_size(root) -> str:
    """The train crop's size as each data config writes it (ImageNet's an int, CIFAR-100's
    a pair)."""
    return "[32,32]" if "cifar" in str(root) else "32"


def num_classes(root) -> int:
    """The fake ImageNet has 8 class slots (2 used); CIFAR-100's labels span 100."""
    return 100 if "cifar" in str(root) else NUM_CLASSES


def overrides(root, out_dir, micro: int, *extra: str) -> list[str]:
    """Data paths, image and model sizes (a 2-stage Swin of width 16 on 32-pixel images,
    window 4), run length."""
    return [
        f"dataloader.train.dataset.0.root={root}",
        f"dataloader.test.0.dataset.root={root}",
        f"{TRAIN_T}.0.size={crop_size(root)}",  # RandomResizedCrop
        f"{TEST_T}.0.size=32",  # Resize
        f"{TEST_T}.1.size=32",  # CenterCrop
        "dataloader.train.num_workers=0",
        "dataloader.test.0.num_workers=0",
        "model.cfg.img_size=32",
        "model.cfg.embed_dim=16",
        "model.cfg.depths=[2,2]",
        "model.cfg.num_heads=[2,4]",
        "model.cfg.window_size=4",
        f"model.cfg.num_classes={num_classes(root)}",
        f"dataloader.train.mixup_func.num_classes={num_classes(root)}",
        "train.dist.pipeline_num_layers=4",
        f"train.train_micro_batch_size={micro}",
        "train.num_accumulation_steps=1",
        "train.test_micro_batch_size=2",
        "train.train_iter=4",
        "train.log_period=1",
        "train.train_epoch=0",
        "train.evaluation.eval_period=4",
        "train.checkpointer.period=2",
        "graph.enabled=False",  # ~20 s of torch.compile per process on these CPUs
        f"train.output_dir={out_dir}",
        *extra,
    ]


def losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


@pytest.mark.parametrize(
    "config, dataset",
    [("swin_imagenet.py", "imagenet"), ("swinv2_cifar100.py", "cifar")],
)
def test_swin_configs_on_one_and_two_processes(data, tmp_path, config, dataset):
    """Swin v1 on LiBai's ImageNet data config, Swin v2 on its CIFAR-100 one (its own
    weight-decay groups, gradient accumulation 8 replaced by 1 as a length override): on 2
    processes LiBai derives dp=2 from the launch, and the same global batch gives the
    one-process losses (fp32)."""
    root = data[dataset]
    one = run_train_net(CONFIGS / config, overrides(root, tmp_path / "one", 4, *SAME_ON_ANY_LAYOUT))
    log = one.stdout + one.stderr
    assert "SoftTargetCrossEntropy" in log
    want = losses(tmp_path / "one")
    assert len(want) == 4
    two = run_train_net(
        CONFIGS / config, overrides(root, tmp_path / "two", 2, *SAME_ON_ANY_LAYOUT), nproc=2
    )
    assert "using 2, as LiBai does" in two.stdout + two.stderr
    assert losses(tmp_path / "two") == pytest.approx(want, rel=1e-5)


def test_swinv2_cifar100_as_shipped_resumes_exactly(data, tmp_path):
    """swinv2_cifar100.py with Mixup / CutMix at prob 1 and stochastic depth as shipped:
    ``--resume`` from the iteration-2 checkpoint continues to the uninterrupted run's losses
    bit for bit."""
    config = CONFIGS / "swinv2_cifar100.py"
    out = tmp_path / "run"
    run_train_net(config, overrides(data["cifar"], out, 2))
    want = losses(out)
    (out / "last_checkpoint").write_text("model_0000001\n")
    (out / "metrics.json").unlink()
    resumed = run_train_net(config, overrides(data["cifar"], out, 2), extra_args=["--resume"])
    assert "Resumed at iteration 2" in resumed.stdout + resumed.stderr
    assert losses(out) == want[2:]
