"""Rotary position embedding (RoPE), the half-split convention used by Llama / Qwen2 / NeoX.

:func:`rope_inv_freq` computes the inverse frequencies of the plain and the scaled variants
used by Hugging Face checkpoints (``rope_scaling`` / ``rope_parameters`` of ``config.json``),
with the formulas of ``transformers.modeling_rope_utils``:

- ``"default"``: ``theta ** (-2i / d)``;
- ``"linear"``: the default divided by ``factor`` (position interpolation);
- ``"dynamic"`` (NTK-aware): beyond ``max_position_embeddings`` the base grows to
  ``theta * (factor * seq_len / max_pos - (factor - 1)) ** (d / (d - 2))``;
- ``"llama3"``: low frequencies divided by ``factor``, high ones kept, a smooth ramp between
  (``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``);
- ``"yarn"`` (DeepSeek-V3, Qwen long context): interpolated (``/ factor``) and original
  frequencies blended by a linear ramp over the dims between the correction range of
  ``beta_fast`` / ``beta_slow`` rotations in ``original_max_position_embeddings``; cos and sin
  multiplied by :func:`rope_attention_factor`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_type(scaling: Mapping | None) -> str:
    """The RoPE variant a ``rope_scaling`` dict names (``rope_type`` or the older ``type``)."""
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope scaling type {kind!r} is not supported; supported: {ROPE_TYPES}")
    return kind


def rope_inv_freq(
    head_size: int,
    theta: float = 10000.0,
    scaling: Mapping | None = None,
    *,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """Inverse frequencies ``[head_size // 2]`` (fp32) of RoPE with base ``theta``.

    Args:
        scaling: ``None`` or a dict with ``rope_type`` (or ``type``) in :data:`ROPE_TYPES`
            and that type's fields (``factor``; for llama3 also ``low_freq_factor``,
            ``high_freq_factor``, ``original_max_position_embeddings``).
        max_position_embeddings: the model's, for ``"dynamic"`` (and the default of llama3's
            ``original_max_position_embeddings``, as in transformers).
        seq_len: the longest position + 1 of the current call, for ``"dynamic"``.
    """
    kind = rope_type(scaling)
    scaling = dict(scaling or {})
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    dim = head_size
    base = theta
    if kind == "dynamic":
        if max_position_embeddings is None:
            raise ValueError("dynamic RoPE scaling needs max_position_embeddings")
        factor = scaling["factor"]
        seq_len = max(seq_len or max_position_embeddings, max_position_embeddings)
        base = base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (
            dim / (dim - 2)
        )
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling, max_position_embeddings)
    elif kind == "yarn":
        inv_freq = _yarn(inv_freq, dim, base, scaling, max_position_embeddings)
    return inv_freq


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: Mapping | None) -> float:
    """The factor cos and sin are multiplied by: YaRN's ``attention_factor`` (given, or
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set, else
    ``mscale(factor)``), 1 for the other variants."""
    if rope_type(scaling) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, all_dim = (
        scaling["factor"],
        scaling.get("mscale"),
        scaling.get("mscale_all_dim"),
    )
    if mscale and all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
    return yarn_mscale(factor)


def _yarn(inv_freq, dim: int, base: float, scaling: Mapping, max_position_embeddings):
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_position_embeddings
    if original is None:
        raise ValueError("yarn RoPE scaling needs original_max_position_embeddings")
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):  # the dim whose wavelength fits ``rotations`` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singular ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    return inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation


def _llama3(inv_freq: torch.Tensor, scaling: Mapping, max_position_embeddings) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling.get("original_max_position_embeddings", max_position_embeddings)
    if old_context_len is None:
        raise ValueError("llama3 RoPE scaling needs original_max_position_embeddings")
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Computes ``(cos, sin)`` tables for given positions; shared by every attention layer.

    It holds no parameters (only the ``inv_freq`` buffer), so it lives on every pipeline stage.
    ``scaling`` / ``max_position_embeddings`` select a scaled variant (see
    :func:`rope_inv_freq`); ``"dynamic"`` recomputes the frequencies for calls whose
    positions go beyond ``max_position_embeddings`` (from that call's longest position,
    without keeping state between calls).
    """

    def __init__(
        self,
        head_size: int,
        base: float = 10000.0,
        inv_freq: torch.Tensor | None = None,
        scaling: Mapping | None = None,
        max_position_embeddings: int | None = None,
    ):
        super().__init__()
        self.head_size, self.base = head_size, base
        self.scaling = dict(scaling) if scaling else None
        self.max_position_embeddings = max_position_embeddings
        self.dynamic = rope_type(scaling) == "dynamic"
        if inv_freq is None:
            inv_freq = rope_inv_freq(
                head_size, base, scaling, max_position_embeddings=max_position_embeddings
            )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        #: YaRN's magnitude factor on cos and sin (1 otherwise)
        self.attention_factor = rope_attention_factor(scaling)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32):
        """``position_ids`` [b, s] -> ``(cos, sin)`` each [b, s, head_size]."""
        inv_freq = self.inv_freq.to(position_ids.device)
        if self.dynamic:
            seq_len = int(position_ids.max()) + 1
            if seq_len > self.max_position_embeddings:
                inv_freq = rope_inv_freq(
                    self.head_size,
                    self.base,
                    self.scaling,
                    max_position_embeddings=self.max_position_embeddings,
                    seq_len=seq_len,
                ).to(position_ids.device)
        freqs = position_ids.float().unsqueeze(-1) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.attention_factor != 1.0:
            return (
                (emb.cos() * self.attention_factor).to(dtype),
                (emb.sin() * self.attention_factor).to(dtype),
            )
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, heads, s, head_size] by the tables from :class:`RotaryEmbedding`."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin
