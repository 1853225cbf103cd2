"""LiBai's vision data pieces (flowvision's names): Mixup / CutMix, SoftTargetCrossEntropy,
RandAugment operations, random erasing, interpolation modes -- each against a formula or a
hand computation in the test -- and the flowvision names inside config files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libai.config import LazyConfig
from libai.config.oneflow_names import UnmappedNameError
from libai.data.auto_augment import (
    RAND_INCREASING_TRANSFORMS,
    AugmentOp,
    RandAugment,
    rand_augment_transform,
)
from libai.data.mixup import Mixup
from libai.data.random_erasing import RandomErasing
from libai.data.transforms import InterpolationMode, Resize, str_to_interp_mode
from libai.layers.soft_target_cross_entropy import SoftTargetCrossEntropy

C = 5  # classes


def smoothed(labels, smoothing=0.1):
    """One-hot with 1 - s + s / C on the class and s / C elsewhere, by hand."""
    out = torch.full((len(labels), C), smoothing / C)
    for row, y in enumerate(labels.tolist()):
        out[row, y] = 1 - smoothing + smoothing / C
    return out


def batch():
    torch.manual_seed(0)
    return torch.randn(4, 3, 8, 10), torch.tensor([0, 3, 1, 4])


def test_mixup_blends_with_the_reversed_batch_at_a_beta_lam():
    x, y = batch()
    np.random.seed(7)
    np.random.rand()  # the prob draw
    lam = np.random.beta(0.8, 0.8)
    np.random.seed(7)
    mixed, target = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, num_classes=C)(x.clone(), y)
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.flip(0))
    want = lam * smoothed(y) + (1 - lam) * smoothed(y.flip(0))
    torch.testing.assert_close(target, want)
    torch.testing.assert_close(target.sum(1), torch.ones(4))


def test_cutmix_pastes_a_box_whose_area_sets_lam():
    x, y = batch()
    np.random.seed(3)
    np.random.rand()
    lam0 = np.random.beta(1.0, 1.0)
    np.random.seed(3)
    mixed, target = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, num_classes=C)(x.clone(), y)
    pasted = (mixed == x.flip(0)) & (mixed != x)
    box = pasted[0, 0]  # the same box on every image and channel
    assert torch.equal(pasted, box.expand_as(pasted))
    rows, cols = box.any(1).nonzero().flatten(), box.any(0).nonzero().flatten()
    h, w = len(rows), len(cols)
    assert box[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].all() and box.sum() == h * w
    torch.testing.assert_close(mixed[~pasted], x[~pasted])
    # sides at most sqrt(1 - lam0) of the image's (the box is clipped at the border)
    assert h <= int(8 * math.sqrt(1 - lam0)) and w <= int(10 * math.sqrt(1 - lam0))
    lam = 1 - h * w / 80
    torch.testing.assert_close(target, lam * smoothed(y) + (1 - lam) * smoothed(y.flip(0)))


def test_mixup_prob_zero_only_smooths_and_odd_batch_is_an_error():
    x, y = batch()
    mixed, target = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.0, num_classes=C)(x.clone(), y)
    assert torch.equal(mixed, x)
    torch.testing.assert_close(target, smoothed(y))
    with pytest.raises(ValueError, match="even batch size"):
        Mixup(num_classes=C)(x[:3].clone(), y[:3])
    with pytest.raises(ValueError, match="mode='rows' is not one of"):
        Mixup(mode="rows")


@pytest.mark.parametrize("mode", ["elem", "pair"])
def test_mixup_elem_and_pair_modes_use_a_lam_per_image_or_pair(mode):
    x, y = batch()
    n = 4 if mode == "elem" else 2
    np.random.seed(5)
    lam = np.random.beta(0.8, 0.8, size=n).astype(np.float32)
    assert (np.random.rand(n) < 1.0).all()  # the prob draws
    if mode == "pair":
        lam = np.concatenate((lam, lam[::-1]))
    np.random.seed(5)
    mixed, target = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, mode=mode, num_classes=C)(x.clone(), y)
    lam = torch.from_numpy(lam)
    for i in range(4):
        j = 3 - i
        torch.testing.assert_close(mixed[i], lam[i] * x[i] + (1 - lam[i]) * x[j])
        want = lam[i] * smoothed(y)[i] + (1 - lam[i]) * smoothed(y)[j]
        torch.testing.assert_close(target[i], want)


def test_soft_target_cross_entropy_formula_and_class_ids():
    torch.manual_seed(1)
    logits, target = torch.randn(4, C), torch.rand(4, C).softmax(-1)
    log_p = logits - logits.exp().sum(-1, keepdim=True).log()
    want = -(target * log_p).sum(-1).mean()
    torch.testing.assert_close(SoftTargetCrossEntropy()(logits, target), want)
    labels = torch.tensor([0, 2, 4, 1])
    torch.testing.assert_close(
        SoftTargetCrossEntropy()(logits, labels), F.cross_entropy(logits, labels)
    )


def image(h=12, w=16, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(pixels), pixels


def test_interpolation_modes():
    assert str_to_interp_mode("bicubic") is InterpolationMode.BICUBIC
    img, _ = image()
    got = Resize((6, 8), interpolation=InterpolationMode.BILINEAR)(img)
    assert np.array_equal(np.asarray(got), np.asarray(img.resize((8, 6), Image.BILINEAR)))
    with pytest.raises(ValueError, match="interpolation 'cubic'"):
        str_to_interp_mode("cubic")


def op(name, magnitude=10, **hparams):
    return AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hparams)


def test_randaugment_operations_by_hand():
    img, px = image()
    rng = np.random.default_rng(0)
    assert np.array_equal(np.asarray(op("Invert")(img, rng)), 255 - px)
    # SolarizeAdd at magnitude 5: +int(0.5 * 110) = 55 below 128, capped at 255
    want = np.where(px < 128, np.minimum(px.astype(int) + 55, 255), px)
    assert np.array_equal(np.asarray(op("SolarizeAdd", 5)(img, rng)), want)
    # PosterizeIncreasing at magnitude 5: keep 4 - int(0.5 * 4) = 2 bits
    assert np.array_equal(np.asarray(op("PosterizeIncreasing", 5)(img, rng)), px & 0b11000000)
    assert np.array_equal(np.asarray(op("Rotate", 0)(img, rng)), px)  # 0 degrees
    # TranslateXRel at magnitude 10: 0.45 * 16 = 7.2 pixels, sign from the generator
    fill = (1, 2, 3)
    r = np.random.default_rng(5)
    sign = -1 if np.random.default_rng(5).random() > 0.5 else 1
    got = np.asarray(op("TranslateXRel", img_mean=fill, interpolation="nearest")(img, r))
    shift = round(sign * 7.2)
    for x in range(16):
        src = x + shift
        want = px[:, src] if 0 <= src < 16 else np.broadcast_to(fill, (12, 3))
        assert np.array_equal(got[:, x], want), x


def test_rand_augment_config_string_and_composition():
    ra = rand_augment_transform("rand-m9-mstd0.5-inc1", {"img_mean": (124, 116, 104)})
    assert ra.num_layers == 2 and [o.name for o in ra.ops] == RAND_INCREASING_TRANSFORMS
    assert all(o.magnitude == 9 and o.magnitude_std == 0.5 and o.prob == 0.5 for o in ra.ops)
    assert rand_augment_transform("rand-m5-n3-mstd101").ops[0].magnitude_std == float("inf")
    with pytest.raises(ValueError, match="unsupported section 'x1'"):
        rand_augment_transform("rand-m9-x1")
    # RandAugment = two ops chosen uniformly with replacement, applied in turn
    img, _ = image()
    ops = [op("Invert"), op("SolarizeAdd", 5), op("Rotate", 0)]
    chosen = np.random.default_rng(2).choice(3, 2, replace=True)
    want = img
    for i in chosen:
        want = ops[i](want, None)
    got = RandAugment(ops, 2)(img, np.random.default_rng(2))
    assert np.array_equal(np.asarray(got), np.asarray(want))


def erased_box(seed, h=20, w=24, min_area=0.02, max_area=1 / 3, min_aspect=0.3):
    """RandomErasing's rectangle, replayed from the formula."""
    rng = np.random.default_rng(seed)
    assert rng.random() <= 1.0  # the probability draw
    for _ in range(10):
        area = rng.uniform(min_area, max_area) * h * w
        aspect = math.exp(rng.uniform(math.log(min_aspect), math.log(1 / min_aspect)))
        bh, bw = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if bw < w and bh < h:
            top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            return (top, left, bh, bw), rng
    raise AssertionError("no box")


def test_random_erasing_const_and_pixel():
    (top, left, bh, bw), _ = erased_box(4)
    out = RandomErasing(probability=1.0, mode="const")(
        torch.ones(3, 20, 24), np.random.default_rng(4)
    )
    want = torch.ones(3, 20, 24)
    want[:, top : top + bh, left : left + bw] = 0
    assert torch.equal(out, want)
    (top, left, bh, bw), rng = erased_box(9)
    noise = torch.from_numpy(rng.standard_normal((3, bh, bw))).float()
    out = RandomErasing(probability=1.0, mode="pixel")(
        torch.ones(3, 20, 24), np.random.default_rng(9)
    )
    torch.testing.assert_close(out[:, top : top + bh, left : left + bw], noise)
    assert (out == 1).sum() == 3 * (20 * 24 - bh * bw)
    untouched = RandomErasing(probability=0.0)(torch.ones(3, 20, 24), np.random.default_rng(0))
    assert torch.equal(untouched, torch.ones(3, 20, 24))


def test_flowvision_names_in_a_config_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text(
        "import flowvision.transforms as transforms\n"
        "from flowvision.transforms import InterpolationMode\n"
        "from flowvision.transforms.functional import str_to_interp_mode\n"
        "from flowvision.data import Mixup\n"
        "from flowvision.data.constants import IMAGENET_DEFAULT_MEAN\n"
        "from flowvision.loss.cross_entropy import SoftTargetCrossEntropy\n"
        "from libai.config import LazyCall\n"
        "aug = LazyCall(transforms.Resize)(size=4, interpolation=InterpolationMode.BICUBIC)\n"
        "mix = LazyCall(Mixup)(num_classes=3)\n"
        "model = dict(mode=str_to_interp_mode('bilinear'), mean=IMAGENET_DEFAULT_MEAN)\n"
        "model['loss'] = SoftTargetCrossEntropy()\n"
    )
    loaded = LazyConfig.load(str(cfg))
    assert loaded.aug._target_ is Resize  # the callables themselves, as LiBai's LazyCall
    assert loaded.mix._target_ is Mixup
    assert isinstance(loaded.model.loss, SoftTargetCrossEntropy)
    assert loaded.model.mode == InterpolationMode.BILINEAR
    assert list(loaded.model.mean) == [0.485, 0.456, 0.406]
    bad = tmp_path / "bad.py"
    bad.write_text("from flowvision.models import resnet50\n")
    with pytest.raises(UnmappedNameError, match=r"flowvision\.models .*has no mapping"):
        LazyConfig.load(str(bad))
