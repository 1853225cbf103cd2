"""Vision augmentations (RandAugment affine ops, Mixup / CutMix draws, random erasing, crops),
the CIFAR dataset's per-read seeds, the sample containers, the cyclic sampler's in-order
batches and ``dir(libai.data)`` -- each against a hand computation or a formula written here
(timm's Mixup / CutMix draw order and box rule, PIL's affine map at pixel centres,
torchvision's RandomResizedCrop fallback)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from vision_files import write_cifar100

import libai.data
from libai.data.auto_augment import AugmentOp, shear_y, translate_y_rel
from libai.data.datasets import CIFAR100Dataset
from libai.data.mixup import Mixup
from libai.data.random_erasing import RandomErasing
from libai.data.samplers import CyclicSampler, EpochIndex
from libai.data.structures import DistTensorData, Instance
from libai.data.transforms import CenterCrop, RandomResizedCrop

C = 5  # classes
NEAREST = Image.Resampling.NEAREST


# ---- references -----------------------------------------------------------------------------
def smoothed(labels, num_classes=C, smoothing=0.1):
    """One-hot with 1 - s + s / C on the class and s / C elsewhere, by hand."""
    out = torch.full((len(labels), num_classes), smoothing / num_classes)
    for row, y in enumerate(labels.tolist()):
        out[row, y] = 1 - smoothing + smoothing / num_classes
    return out


def ref_box(h, w, lam):
    """timm's ``rand_bbox``: sides ``int(side * sqrt(1 - lam))``, centre ``randint`` on the
    global numpy generator (rows then columns), clipped to the image."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = np.random.randint(0, h), np.random.randint(0, w)
    yl, yh = min(max(cy - cut_h // 2, 0), h), min(max(cy + cut_h // 2, 0), h)
    xl, xh = min(max(cx - cut_w // 2, 0), w), min(max(cx + cut_w // 2, 0), w)
    return yl, yh, xl, xh


def batch():
    torch.manual_seed(0)
    return torch.randn(4, 3, 8, 10), torch.tensor([0, 3, 1, 4])


def gradient(h=8, w=6):
    """An ``L`` image whose pixel (y, x) is 10 y + x."""
    return (np.arange(h)[:, None] * 10 + np.arange(w)[None, :]).astype(np.uint8)


def first_seed(pred):
    """The first numpy seed whose first draws satisfy ``pred(RandomState)``."""
    for seed in range(10_000):
        if pred(np.random.RandomState(seed)):
            return seed
    raise AssertionError("no seed found")


# ---- RandAugment operations -----------------------------------------------------------------
def test_shear_y_maps_output_pixel_centres_through_the_shear():
    """shear_y(f): output (x, y) reads input (x, f x + y) at pixel centres, i.e. row
    floor(y + f (x + 0.5) + 0.5) (fill where off the image); f = 0 is the identity. Pins the
    matrix's zero translation against the formula."""
    a = gradient()
    img = Image.fromarray(a, "L")
    assert np.array_equal(np.asarray(shear_y(img, 0.0, 7, NEAREST)), a)
    want = np.full_like(a, 7)
    for y in range(a.shape[0]):
        for x in range(a.shape[1]):
            src = math.floor(y + 0.5 * (x + 0.5) + 0.5)
            if src < a.shape[0]:
                want[y, x] = a[src, x]
    assert np.array_equal(np.asarray(shear_y(img, 0.5, 7, NEAREST)), want)


def test_translate_y_rel_shifts_rows_by_pct_of_the_height():
    """translate_y_rel(pct): output row y is input row y + pct * H (fill below), columns
    untouched -- a pure vertical shift, by hand."""
    a = gradient()
    img = Image.fromarray(a, "L")
    out = np.asarray(translate_y_rel(img, 0.25, 7, NEAREST))  # 0.25 * 8 = 2 rows
    want = np.full_like(a, 7)
    want[:-2] = a[2:]
    assert np.array_equal(out, want)
    assert np.array_equal(np.asarray(translate_y_rel(img, 0.0, 7, NEAREST)), a)


def test_augment_op_clips_the_magnitude_at_hparams_magnitude_max():
    """hparams magnitude_max=5 caps magnitude 10: Posterize keeps int(5 / 10 * 4) = 2 bits
    (pixel & 0b11000000 by hand), not the 4 bits of magnitude 10."""
    a = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = Image.fromarray(a, "L")
    op = AugmentOp("Posterize", prob=1.0, magnitude=10, hparams={"magnitude_max": 5})
    out = np.asarray(op(img, np.random.default_rng(0)))
    assert np.array_equal(out, a & 0b11000000)


# ---- Mixup / CutMix -------------------------------------------------------------------------
def test_mixup_defaults_switch_prob_half_between_cutmix_and_mixup():
    """Default switch_prob = 0.5 (timm): with both alphas on, the batch is CutMixed when the
    second uniform draw (after the prob draw) is < 0.5, else Mixed; lam ~ Beta(alpha, alpha)
    is the third draw, the CutMix box timm's rand_bbox after it."""
    x, y = batch()
    # a draw just above 0.5: Mixup blend with the reversed batch
    seed = first_seed(lambda r: r.rand() < 1.0 and 0.5 <= r.rand() < 0.6)
    np.random.seed(seed)
    np.random.rand(2)
    lam = np.random.beta(1.0, 1.0)
    np.random.seed(seed)
    mixed, target = Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, num_classes=C)(x.clone(), y)
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.flip(0))
    torch.testing.assert_close(target, lam * smoothed(y) + (1 - lam) * smoothed(y.flip(0)))

    # a draw just below 0.5: CutMix, a box of the reversed batch pasted in
    seed = first_seed(lambda r: r.rand() < 1.0 and 0.4 <= r.rand() < 0.5)
    np.random.seed(seed)
    np.random.rand(2)
    lam0 = np.random.beta(1.0, 1.0)
    yl, yh, xl, xh = ref_box(8, 10, lam0)
    want = x.clone()
    want[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
    lam = 1 - (yh - yl) * (xh - xl) / 80
    np.random.seed(seed)
    mixed, target = Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, num_classes=C)(x.clone(), y)
    assert (yh - yl) * (xh - xl) > 0
    torch.testing.assert_close(mixed, want)
    torch.testing.assert_close(target, lam * smoothed(y) + (1 - lam) * smoothed(y.flip(0)))


def test_mixup_default_num_classes_is_1000():
    """Mixup() targets are [B, 1000] with smoothing 0.1 / 1000 off the class (defaults:
    mixup_alpha 1, prob 1, label_smoothing 0.1, num_classes 1000)."""
    x, y = batch()
    y = torch.tensor([0, 999, 5, 17])
    np.random.seed(0)
    np.random.rand()
    lam = np.random.beta(1.0, 1.0)
    np.random.seed(0)
    _, target = Mixup()(x.clone(), y)
    assert target.shape == (4, 1000)
    want = lam * smoothed(y, 1000) + (1 - lam) * smoothed(y.flip(0), 1000)
    torch.testing.assert_close(target, want)


def test_elem_cutmix_keeps_the_drawn_lam_when_correct_lam_is_false():
    """mode="elem", CutMix only, correct_lam=False: lam_i = Beta(a, a) draws (size B, then
    B uniforms for prob), image i gets timm's box of image B - 1 - i, and the target uses
    the drawn lam_i, not the box's area."""
    x, y = batch()
    alpha = 1.0
    np.random.seed(11)
    lam = np.random.beta(alpha, alpha, size=4).astype(np.float32)
    np.random.rand(4)
    want = x.clone()
    corrected = []
    for i in range(4):
        j = 3 - i
        yl, yh, xl, xh = ref_box(8, 10, float(lam[i]))
        want[i][:, yl:yh, xl:xh] = x[j][:, yl:yh, xl:xh]
        corrected.append(1 - (yh - yl) * (xh - xl) / 80)
    assert not np.allclose(corrected, lam)  # the uncorrected lam is what is pinned
    np.random.seed(11)
    mix = Mixup(mixup_alpha=0.0, cutmix_alpha=alpha, mode="elem", correct_lam=False, num_classes=C)
    mixed, target = mix(x.clone(), y)
    torch.testing.assert_close(mixed, want)
    lam_t = torch.tensor(lam).unsqueeze(1)
    torch.testing.assert_close(target, lam_t * smoothed(y) + (1 - lam_t) * smoothed(y.flip(0)))


def test_elem_mode_draws_cutmix_lam_from_the_cutmix_beta():
    """mode="elem", both alphas on: per image, uniform < switch_prob picks CutMix; lam_i is
    Beta(cutmix_alpha) for CutMix images and Beta(mixup_alpha) for the others (both drawn
    for all B, CutMix first), then B prob uniforms; CutMix lam corrected to the box area."""
    x, y = batch()
    ma, ca = 0.4, 2.0

    def mixed_choice(r):
        cut = r.rand(4) < 0.5
        return cut.any() and not cut.all()

    seed = first_seed(mixed_choice)
    np.random.seed(seed)
    use_cut = np.random.rand(4) < 0.5
    lam = np.where(use_cut, np.random.beta(ca, ca, size=4), np.random.beta(ma, ma, size=4)).astype(
        np.float32
    )
    np.random.rand(4)
    want = x.clone()
    lams = []
    for i in range(4):
        j = 3 - i
        if use_cut[i]:
            yl, yh, xl, xh = ref_box(8, 10, float(lam[i]))
            want[i][:, yl:yh, xl:xh] = x[j][:, yl:yh, xl:xh]
            lams.append(1 - (yh - yl) * (xh - xl) / 80)
        else:
            want[i] = x[i] * float(lam[i]) + x[j] * (1 - float(lam[i]))
            lams.append(float(lam[i]))
    np.random.seed(seed)
    mixed, target = Mixup(mixup_alpha=ma, cutmix_alpha=ca, mode="elem", num_classes=C)(x.clone(), y)
    torch.testing.assert_close(mixed, want)
    lam_t = torch.tensor(lams, dtype=torch.float32).unsqueeze(1)
    torch.testing.assert_close(target, lam_t * smoothed(y) + (1 - lam_t) * smoothed(y.flip(0)))


# ---- random erasing -------------------------------------------------------------------------
def test_random_erasing_batch_erases_each_image_after_the_first_split():
    """A [B, C, H, W] batch with num_splits=2: images 0..B/2-1 untouched, each later image
    erased in turn with the generator's draws (prob uniform, area uniform in
    [0.02, 1/3] * H W, log-uniform aspect in [0.3, 1/0.3], top / left integers), zeros in
    const mode -- replayed here on a twin generator."""
    x = torch.ones(4, 3, 16, 16)
    out = RandomErasing(probability=1.0, num_splits=2)(x, np.random.default_rng(5))
    twin = np.random.default_rng(5)
    want = torch.ones(4, 3, 16, 16)
    for i in (2, 3):
        assert twin.random() <= 1.0
        for _ in range(10):
            area = twin.uniform(0.02, 1 / 3) * 256
            aspect = math.exp(twin.uniform(math.log(0.3), math.log(1 / 0.3)))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if h < 16 and w < 16:
                top, left = int(twin.integers(0, 16 - h + 1)), int(twin.integers(0, 16 - w + 1))
                want[i, :, top : top + h, left : left + w] = 0
                break
    assert (want[2:] == 0).any()
    assert torch.equal(out, want)


# ---- crops ----------------------------------------------------------------------------------
def test_center_crop_zero_pads_a_small_image_then_crops_the_centre():
    """CenterCrop((4, 5)) of a 3 x 2 image: the image pasted at ((5-3)//2, (4-2)//2) on
    zeros; of a 7 x 2 image: padded to 7 x 4 at row 1, then columns 1..5 -- by hand."""
    a = (np.arange(6, dtype=np.uint8).reshape(2, 3) + 1) * 20
    out = np.asarray(CenterCrop((4, 5))(Image.fromarray(a, "L")))
    want = np.zeros((4, 5), np.uint8)
    want[1:3, 1:4] = a
    assert np.array_equal(out, want)

    b = (np.arange(14, dtype=np.uint8).reshape(2, 7) + 1) * 10
    out = np.asarray(CenterCrop((4, 5))(Image.fromarray(b, "L")))
    want = np.zeros((4, 5), np.uint8)
    want[1:3] = b[:, 1:6]
    assert np.array_equal(out, want)


def test_random_resized_crop_rejects_a_reversed_ratio_range():
    """ratio must be (min, max): (4/3, 3/4) is a ValueError, as is a reversed scale."""
    with pytest.raises(ValueError, match="must be \\(min, max\\) ranges"):
        RandomResizedCrop(8, ratio=(4 / 3, 3 / 4))
    with pytest.raises(ValueError, match="must be \\(min, max\\) ranges"):
        RandomResizedCrop(8, scale=(1.0, 0.5))


def test_random_resized_crop_falls_back_to_the_largest_centred_crop_in_ratio():
    """scale=(1, 1) on a 10 x 100 (100 x 10) image never fits in ten tries (sides >= 27), so
    torchvision's fallback: width 10, height round(10 / (3/4)) = 13, centred at row 43
    (height 10, width round(10 * 4/3) = 13 at column 43)."""
    crop = RandomResizedCrop(8, scale=(1.0, 1.0))
    assert crop.get_params(10, 100, np.random.default_rng(0)) == (43, 0, 13, 10)
    assert crop.get_params(100, 10, np.random.default_rng(0)) == (0, 43, 10, 13)


# ---- CIFAR reads ----------------------------------------------------------------------------
class DrawOne:
    """A transform that returns the first uniform of the generator it is given."""

    uses_rng = True

    def __call__(self, image, rng=None):
        return torch.tensor([rng.random()], dtype=torch.float64)


def test_cifar_reads_seed_the_transform_with_seed_index_and_read_count(tmp_path):
    """Without an epoch, the k-th read of index i draws from default_rng([seed, i, k])
    (k = 0, 1, 2, ...); an EpochIndex(i, e) uses [seed, i, e] and does not count."""
    root = write_cifar100(tmp_path)
    ds = CIFAR100Dataset(str(root), train=True, transform=DrawOne(), seed=5)

    def want(i, e):
        return torch.tensor([np.random.default_rng([5, i, e]).random()], dtype=torch.float32)

    for k in range(3):
        torch.testing.assert_close(ds[2].get("images").tensor, want(2, k))
    torch.testing.assert_close(ds[EpochIndex(2, 7)].get("images").tensor, want(2, 7))
    torch.testing.assert_close(ds[2].get("images").tensor, want(2, 3))
    torch.testing.assert_close(ds[1].get("images").tensor, want(1, 0))


# ---- structures -----------------------------------------------------------------------------
def test_dist_tensor_data_to_global_without_dist_uses_device_type_or_cpu(monkeypatch):
    """With no distributed runtime, to_global() puts the tensor on CPU, and on
    ``device_type`` when given ("meta" here); it returns the same object."""
    from libai import dist

    monkeypatch.setattr(dist, "_DIST_UTIL", None)  # whatever an earlier test left set up
    assert dist.current_dist_util() is None
    item = DistTensorData(torch.arange(3))
    assert item.to_global() is item
    assert item.tensor.device == torch.device("cpu")
    assert torch.equal(item.tensor, torch.arange(3))
    item.to_global(device_type="meta")
    assert item.tensor.device.type == "meta"


def test_instance_hides_underscore_names_and_survives_pickling():
    """Instance.__getattr__ refuses any name starting with '_' (so a field set as '_x' is
    not an attribute, and pickle's __setstate__ / _fields look-ups on a bare instance raise
    AttributeError instead of recursing): a pickle round trip keeps the fields."""
    inst = Instance(a=torch.tensor([1, 2]), b=[3])
    inst.set("_hidden", 1)
    assert inst.get("_hidden") == 1
    with pytest.raises(AttributeError):
        inst._hidden  # noqa: B018
    back = pickle.loads(pickle.dumps(inst))
    assert torch.equal(back.a, torch.tensor([1, 2])) and back.b == [3]
    assert list(back.get_fields()) == ["a", "b", "_hidden"]


# ---- samplers and the package ---------------------------------------------------------------
def test_cyclic_sampler_in_order_gives_each_rank_its_slice_of_each_group():
    """shuffle=False, 10 samples, micro 2 x dp 2: groups [0..3], [4..7] (8, 9 left out),
    rank 1 takes positions 2, 3 of each group, epoch after epoch -- by hand."""
    sampler = CyclicSampler(
        list(range(10)), 2, shuffle=False, data_parallel_rank=1, data_parallel_size=2
    )
    it = iter(sampler)
    assert [next(it) for _ in range(5)] == [[2, 3], [6, 7], [2, 3], [6, 7], [2, 3]]
    assert sampler.epoch_order(3).tolist() == list(range(10))


def test_dir_of_libai_data_lists_the_lazy_exports():
    """dir(libai.data) is sorted and lists every lazily imported name of __all__ as well as
    the module's own globals."""
    names = dir(libai.data)
    assert names == sorted(names)
    assert set(libai.data.__all__) <= set(names)
    assert {"__getattr__", "importlib", "_EXPORTS"} <= set(names)
