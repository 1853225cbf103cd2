"""Mixup and CutMix on a batch, with soft (label-smoothed) targets: timm's / flowvision's
``Mixup`` semantics.

Per call, with probability ``prob`` the batch is mixed with its reverse (``x.flip(0)``):
CutMix (probability ``switch_prob`` when both alphas are positive) pastes a box of the
reversed batch, Mixup blends ``lam * x + (1 - lam) * x.flip(0)``; ``lam ~ Beta(alpha,
alpha)``. For CutMix the box is centred uniformly, sides ``sqrt(1 - lam)`` of the image's,
clipped at the border, and (``correct_lam``) ``lam = 1 - box area / image area``. The target
is ``lam * smooth(y) + (1 - lam) * smooth(y.flip(0))`` (``mode="elem"``: a ``lam`` and
a mixing decision per image, ``"pair"``: per pair of images ``i`` and ``B - 1 - i``) with ``smooth`` = one-hot with
``1 - label_smoothing + label_smoothing / num_classes`` on the class and
``label_smoothing / num_classes`` elsewhere.

Randomness is drawn from numpy's global generator, as timm does: the runtime seeds it per
data-parallel rank and saves it in checkpoints, so a resumed run draws the same values.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Mixup", "cutmix_bbox_and_lam", "mixup_target", "one_hot"]


def one_hot(labels: torch.Tensor, num_classes: int, on_value=1.0, off_value=0.0) -> torch.Tensor:
    """``[B]`` class ids -> ``[B, num_classes]`` with ``on_value`` / ``off_value``."""
    labels = labels.long().view(-1, 1)
    out = torch.full((labels.shape[0], num_classes), off_value, device=labels.device)
    return out.scatter_(1, labels, on_value)


def mixup_target(labels, num_classes: int, lam=1.0, smoothing: float = 0.0):
    """The smoothed one-hot of ``labels`` mixed with that of ``labels.flip(0)`` (``lam`` a
    number, or ``[B, 1]`` per image)."""
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    y1 = one_hot(labels, num_classes, on, off)
    y2 = one_hot(labels.flip(0), num_classes, on, off)
    return y1 * lam + y2 * (1.0 - lam)


def cutmix_bbox_and_lam(img_shape, lam: float, correct_lam: bool = True, rng=np.random):
    """``((y_lo, y_hi, x_lo, x_hi), lam)``: a box of sides ``sqrt(1 - lam)`` of the image's,
    centred uniformly and clipped; ``lam`` corrected to ``1 - box area / image area``."""
    img_h, img_w = img_shape[-2:]
    ratio = np.sqrt(1.0 - lam)
    cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
    cy, cx = int(rng.randint(0, img_h)), int(rng.randint(0, img_w))
    yl, yh = int(np.clip(cy - cut_h // 2, 0, img_h)), int(np.clip(cy + cut_h // 2, 0, img_h))
    xl, xh = int(np.clip(cx - cut_w // 2, 0, img_w)), int(np.clip(cx + cut_w // 2, 0, img_w))
    if correct_lam:
        lam = 1.0 - (yh - yl) * (xh - xl) / float(img_h * img_w)
    return (yl, yh, xl, xh), lam


class Mixup:
    """``mixup(images [B, C, H, W], labels [B]) -> (mixed images, soft targets [B, classes])``.

    Args:
        mixup_alpha: Beta parameter of Mixup (0 = off).
        cutmix_alpha: Beta parameter of CutMix (0 = off).
        cutmix_minmax: box size bounds instead of ``lam`` (not supported; must be None).
        prob: probability of mixing a batch at all.
        switch_prob: probability of CutMix instead of Mixup when both are on.
        mode: ``"batch"`` (one ``lam`` and box for the batch), ``"elem"`` (per image ``i``,
            mixed with image ``B - 1 - i``) or ``"pair"`` (per pair ``i``, ``B - 1 - i``, both
            mixed with the same ``lam``).
        correct_lam: CutMix's ``lam`` from the clipped box area.
        label_smoothing: smoothing of the one-hot targets.
        num_classes: classes of the targets.
    """

    def __init__(
        self,
        mixup_alpha: float = 1.0,
        cutmix_alpha: float = 0.0,
        cutmix_minmax=None,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        mode: str = "batch",
        correct_lam: bool = True,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
    ):
        if mode not in ("batch", "elem", "pair"):
            raise ValueError(f"Mixup mode={mode!r} is not one of 'batch', 'elem', 'pair'.")
        if cutmix_minmax is not None:
            raise NotImplementedError("Mixup cutmix_minmax is not implemented; set it to None.")
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.mix_prob, self.switch_prob = float(prob), float(switch_prob)
        self.mode, self.correct_lam = mode, correct_lam
        self.label_smoothing, self.num_classes = float(label_smoothing), int(num_classes)
        self.mixup_enabled = True

    def _params_per_batch(self) -> tuple[float, bool]:
        lam, use_cutmix = 1.0, False
        if self.mixup_enabled and np.random.rand() < self.mix_prob:
            if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
                use_cutmix = bool(np.random.rand() < self.switch_prob)
                alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
                lam = float(np.random.beta(alpha, alpha))
            elif self.mixup_alpha > 0:
                lam = float(np.random.beta(self.mixup_alpha, self.mixup_alpha))
            elif self.cutmix_alpha > 0:
                use_cutmix, lam = True, float(np.random.beta(self.cutmix_alpha, self.cutmix_alpha))
        return lam, use_cutmix

    def _params_per_elem(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        lam = np.ones(n, dtype=np.float32)
        use_cutmix = np.zeros(n, dtype=bool)
        if self.mixup_enabled:
            if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
                use_cutmix = np.random.rand(n) < self.switch_prob
                lam_mix = np.where(
                    use_cutmix,
                    np.random.beta(self.cutmix_alpha, self.cutmix_alpha, size=n),
                    np.random.beta(self.mixup_alpha, self.mixup_alpha, size=n),
                )
            elif self.mixup_alpha > 0:
                lam_mix = np.random.beta(self.mixup_alpha, self.mixup_alpha, size=n)
            elif self.cutmix_alpha > 0:
                use_cutmix = np.ones(n, dtype=bool)
                lam_mix = np.random.beta(self.cutmix_alpha, self.cutmix_alpha, size=n)
            else:
                return lam, use_cutmix
            lam = np.where(np.random.rand(n) < self.mix_prob, lam_mix.astype(np.float32), lam)
        return lam, use_cutmix

    def _mix_elems(self, x: torch.Tensor, pairs: bool) -> torch.Tensor:
        """Image ``i`` mixed with image ``B - 1 - i`` at its own ``lam`` (``pairs``: both
        images of a pair at the pair's); returns ``lam`` per image ``[B, 1]``."""
        batch = len(x)
        lam, use_cutmix = self._params_per_elem(batch // 2 if pairs else batch)
        orig = x.clone()
        for i in range(len(lam)):
            j = batch - i - 1
            if lam[i] == 1.0:
                continue
            if use_cutmix[i]:
                (yl, yh, xl, xh), lam[i] = cutmix_bbox_and_lam(x[i].shape, lam[i], self.correct_lam)
                x[i][:, yl:yh, xl:xh] = orig[j][:, yl:yh, xl:xh]
                if pairs:
                    x[j][:, yl:yh, xl:xh] = orig[i][:, yl:yh, xl:xh]
            else:
                x[i] = orig[i] * lam[i] + orig[j] * (1 - lam[i])
                if pairs:
                    x[j] = orig[j] * lam[i] + orig[i] * (1 - lam[i])
        if pairs:
            lam = np.concatenate((lam, lam[::-1]))
        return torch.tensor(lam, device=x.device, dtype=x.dtype).unsqueeze(1)

    def _mix_batch(self, x: torch.Tensor) -> float:
        lam, use_cutmix = self._params_per_batch()
        if lam == 1.0:
            return 1.0
        if use_cutmix:
            (yl, yh, xl, xh), lam = cutmix_bbox_and_lam(x.shape, lam, self.correct_lam)
            x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
        else:
            flipped = x.flip(0).mul_(1.0 - lam)
            x.mul_(lam).add_(flipped)
        return lam

    def __call__(self, x: torch.Tensor, target: torch.Tensor):
        if len(x) % 2:
            raise ValueError(
                f"Mixup needs an even batch size per rank, got {len(x)}; set an even "
                "train.train_micro_batch_size."
            )
        if self.mode == "batch":
            lam = self._mix_batch(x)
        else:
            lam = self._mix_elems(x, pairs=self.mode == "pair")
        return x, mixup_target(target, self.num_classes, lam, self.label_smoothing)

    def __repr__(self) -> str:
        return (
            f"Mixup(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, "
            f"prob={self.mix_prob}, switch_prob={self.switch_prob}, mode={self.mode!r}, "
            f"label_smoothing={self.label_smoothing}, num_classes={self.num_classes})"
        )
