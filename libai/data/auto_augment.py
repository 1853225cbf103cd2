"""RandAugment with timm's / flowvision's operations, levels and config strings.

``rand_augment_transform("rand-m9-mstd0.5-inc1", hparams)`` (the ImageNet recipe of DeiT and
LiBai) builds :class:`RandAugment`: per image, ``n`` operations (default 2) are picked
uniformly with replacement; each applies with probability 0.5 at a magnitude drawn from
``N(m, mstd)`` clipped to ``[0, 10]`` (``mstd`` > 100: uniform on ``[0, m]``). ``inc1`` selects
the "increasing" variants whose strength grows with the magnitude. Geometric operations
(rotate, shear, translate) are negated with probability 0.5 and fill with
``hparams["img_mean"]``.

Randomness comes from the ``numpy.random.Generator`` the dataset passes (see
:mod:`libai.data.transforms`), so a sample's augmentation is a function of its seed.
"""

from __future__ import annotations

import re

from PIL import Image, ImageEnhance, ImageOps

from libai.data.transforms import _interpolation, _rng

__all__ = ["AugmentOp", "RandAugment", "rand_augment_transform", "RAND_TRANSFORMS"]

_LEVEL_DENOM = 10.0
_FILL = (128, 128, 128)
_RANDOM_RESAMPLE = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)


# ---- the operations: (image, *level args, fillcolor, resample) -> image ------------------------
def _affine(img, matrix, fillcolor, resample):
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample, fillcolor=fillcolor)


def shear_x(img, factor, fillcolor, resample):
    return _affine(img, (1, factor, 0, 0, 1, 0), fillcolor, resample)


def shear_y(img, factor, fillcolor, resample):
    return _affine(img, (1, 0, 0, factor, 1, 0), fillcolor, resample)


def translate_x_rel(img, pct, fillcolor, resample):
    return _affine(img, (1, 0, pct * img.size[0], 0, 1, 0), fillcolor, resample)


def translate_y_rel(img, pct, fillcolor, resample):
    return _affine(img, (1, 0, 0, 0, 1, pct * img.size[1]), fillcolor, resample)


def rotate(img, degrees, fillcolor, resample):
    return img.rotate(degrees, resample=resample, fillcolor=fillcolor)


def solarize_add(img, add, fillcolor, resample, thresh=128):
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def posterize(img, bits, fillcolor, resample):
    return img if bits >= 8 else ImageOps.posterize(img, bits)


def _enhance(enhancer):
    return lambda img, factor, fillcolor, resample: enhancer(img).enhance(factor)


def _plain(op):
    return lambda img, *args, fillcolor, resample: op(img, *args)


_OPS = {
    "AutoContrast": _plain(ImageOps.autocontrast),
    "Equalize": _plain(ImageOps.equalize),
    "Invert": _plain(ImageOps.invert),
    "Rotate": rotate,
    "Posterize": posterize,
    "Solarize": _plain(ImageOps.solarize),
    "SolarizeAdd": solarize_add,
    "Color": _enhance(ImageEnhance.Color),
    "Contrast": _enhance(ImageEnhance.Contrast),
    "Brightness": _enhance(ImageEnhance.Brightness),
    "Sharpness": _enhance(ImageEnhance.Sharpness),
    "ShearX": shear_x,
    "ShearY": shear_y,
    "TranslateXRel": translate_x_rel,
    "TranslateYRel": translate_y_rel,
}
for _name in ("Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness"):
    _OPS[_name + "Increasing"] = _OPS[_name]


# ---- magnitude (0..10) -> the operation's arguments ---------------------------------------------
def _negate(value, rng):
    return -value if rng.random() > 0.5 else value


_LEVELS = {
    "AutoContrast": lambda m, h, rng: (),
    "Equalize": lambda m, h, rng: (),
    "Invert": lambda m, h, rng: (),
    "Rotate": lambda m, h, rng: (_negate(m / _LEVEL_DENOM * 30.0, rng),),
    "Posterize": lambda m, h, rng: (int(m / _LEVEL_DENOM * 4),),
    "PosterizeIncreasing": lambda m, h, rng: (4 - int(m / _LEVEL_DENOM * 4),),
    "Solarize": lambda m, h, rng: (int(m / _LEVEL_DENOM * 256),),
    "SolarizeIncreasing": lambda m, h, rng: (256 - int(m / _LEVEL_DENOM * 256),),
    "SolarizeAdd": lambda m, h, rng: (int(m / _LEVEL_DENOM * 110),),
    "ShearX": lambda m, h, rng: (_negate(m / _LEVEL_DENOM * 0.3, rng),),
    "ShearY": lambda m, h, rng: (_negate(m / _LEVEL_DENOM * 0.3, rng),),
    "TranslateXRel": lambda m, h, rng: (_negate(m / _LEVEL_DENOM * h["translate_pct"], rng),),
    "TranslateYRel": lambda m, h, rng: (_negate(m / _LEVEL_DENOM * h["translate_pct"], rng),),
}
for _name in ("Color", "Contrast", "Brightness", "Sharpness"):
    _LEVELS[_name] = lambda m, h, rng: (m / _LEVEL_DENOM * 1.8 + 0.1,)
    _LEVELS[_name + "Increasing"] = lambda m, h, rng: (1.0 + _negate(m / _LEVEL_DENOM * 0.9, rng),)

#: timm's default RandAugment operations, and the "increasing" ones (``inc1``)
RAND_TRANSFORMS = (
    "AutoContrast Equalize Invert Rotate Posterize Solarize SolarizeAdd Color Contrast "
    "Brightness Sharpness ShearX ShearY TranslateXRel TranslateYRel"
).split()
RAND_INCREASING_TRANSFORMS = (
    "AutoContrast Equalize Invert Rotate PosterizeIncreasing SolarizeIncreasing SolarizeAdd "
    "ColorIncreasing ContrastIncreasing BrightnessIncreasing SharpnessIncreasing ShearX ShearY "
    "TranslateXRel TranslateYRel"
).split()


class AugmentOp:
    """One named operation applied with probability ``prob`` at magnitude ``magnitude``
    (0..10; ``hparams["magnitude_std"]`` adds Gaussian noise, ``inf`` = uniform on
    ``[0, magnitude]``; clipped to ``[0, hparams.get("magnitude_max", 10)]``)."""

    uses_rng = True

    def __init__(self, name: str, prob: float = 0.5, magnitude: float = 10, hparams=None):
        if name not in _OPS:
            raise ValueError(f"unknown RandAugment operation {name!r}; known: {sorted(_OPS)}")
        self.name, self.prob, self.magnitude = name, float(prob), float(magnitude)
        self.hparams = {"translate_pct": 0.45, **dict(hparams or {})}
        self.fillcolor = tuple(self.hparams.get("img_mean", _FILL))
        interp = self.hparams.get("interpolation")
        self.resample = _RANDOM_RESAMPLE if interp is None else _interpolation(interp)
        self.magnitude_std = float(self.hparams.get("magnitude_std", 0))
        self.magnitude_max = self.hparams.get("magnitude_max")

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        rng = _rng(rng)
        if self.prob < 1.0 and rng.random() > self.prob:
            return img
        magnitude = self.magnitude
        if self.magnitude_std == float("inf"):
            magnitude = rng.uniform(0, magnitude)
        elif self.magnitude_std > 0:
            magnitude = rng.normal(magnitude, self.magnitude_std)
        magnitude = max(0.0, min(magnitude, self.magnitude_max or _LEVEL_DENOM))
        args = _LEVELS[self.name](magnitude, self.hparams, rng)
        resample = self.resample
        if isinstance(resample, tuple):
            resample = resample[int(rng.integers(len(resample)))]
        return _OPS[self.name](img, *args, fillcolor=self.fillcolor, resample=resample)

    def __repr__(self) -> str:
        return f"AugmentOp(name={self.name}, p={self.prob}, m={self.magnitude})"


class RandAugment:
    """``num_layers`` of ``ops`` picked uniformly with replacement, applied in turn."""

    uses_rng = True

    def __init__(self, ops, num_layers: int = 2):
        self.ops, self.num_layers = list(ops), int(num_layers)

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        rng = _rng(rng)
        for i in rng.choice(len(self.ops), self.num_layers, replace=True):
            img = self.ops[int(i)](img, rng)
        return img

    def __repr__(self) -> str:
        return f"RandAugment(n={self.num_layers}, ops={self.ops})"


def rand_augment_transform(config_str: str, hparams=None) -> RandAugment:
    """RandAugment from timm's config string ``rand-m<M>[-n<N>][-mstd<S>][-mmax<X>][-inc<0|1>]``.

    ``hparams``: ``img_mean`` (fill colour), ``interpolation`` (default: bilinear or bicubic
    at random), ``translate_pct`` (0.45); ``mstd`` / ``mmax`` set ``magnitude_std`` /
    ``magnitude_max`` unless given. Weighted op choice (``-w``) is not supported.
    """
    hparams = dict(hparams or {})
    parts = config_str.split("-")
    if parts[0] != "rand":
        raise ValueError(f"RandAugment config {config_str!r} must start with 'rand'")
    magnitude, num_layers, names = _LEVEL_DENOM, 2, RAND_TRANSFORMS
    for part in parts[1:]:
        pieces = re.split(r"(\d.*)", part)
        if len(pieces) < 2:
            continue  # timm skips a section without a number
        key, value = pieces[0], pieces[1]
        if key == "mstd":
            std = float(value)
            hparams.setdefault("magnitude_std", float("inf") if std > 100 else std)
        elif key == "mmax":
            hparams.setdefault("magnitude_max", int(value))
        elif key == "inc":
            names = RAND_INCREASING_TRANSFORMS if int(value) else RAND_TRANSFORMS
        elif key == "m":
            magnitude = int(value)
        elif key == "n":
            num_layers = int(value)
        else:
            raise ValueError(
                f"RandAugment config {config_str!r}: unsupported section {part!r} (supported: "
                "m, n, mstd, mmax, inc)"
            )
    ops = [AugmentOp(name, prob=0.5, magnitude=magnitude, hparams=hparams) for name in names]
    return RandAugment(ops, num_layers)
