"""FP8 training for libai's :class:`~libai.layers.Linear`: torchao's float8 matmuls.

``train.amp.fp8 = "rowwise"`` or ``"tensorwise"`` (torchao's recipe names) makes the large
Linear layers of a model run their three matmuls (output, input gradient, weight gradient)
in float8 with dynamic scaling: each operand is scaled by its amax (per tensor, or per row
for ``rowwise``), cast to ``float8_e4m3fn`` (``e5m2`` for gradients under ``tensorwise``)
and multiplied by ``torch._scaled_mm``. Parameters, master weights and the optimizer stay in
their own dtype; only the matmul operands are float8.

Which layers convert follows torchao's recommendation for H100 (``float8_linear_utils``'s
auto filter): both dims divisible by 16, and large enough that the casts pay for
themselves (rowwise: out > 2048 and in > 1024, not both out <= 4096 and in <= 2048;
tensorwise: not in <= 4096 with out <= 1024). ``min_size=False`` keeps only the
divisibility rule (tests on tiny models use it).

Where the hardware has no float8 matmul (the CPU, GPUs before compute capability 8.9) the
*emulated* path runs: the same scaling and casts, the matmul in high precision. The suite
checks the numbers through it; speed is a GPU question (``docs/benchmarks.md``).

torchao is an optional dependency: ``pip install 'libai[fp8]'``.

Layout: each rank scales its own local operands. Under data parallelism and ZeRO-1/2 every
rank holds whole weights, and under ZeRO-3 FSDP2 all-gathers a block's weights before its
forward (in high precision: float8 all-gather is not used), so the scales are those of one
process running the same micro-batch. Tensor parallelism would scale per shard, and is
refused (see :func:`check_fp8_layout`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "FP8_RECIPES",
    "Float8Matmul",
    "check_fp8_layout",
    "enable_float8_training",
    "float8_available",
    "float8_linear",
    "wants_float8",
]

#: the recipes ``train.amp.fp8`` accepts (torchao's names)
FP8_RECIPES = ("rowwise", "tensorwise")


def float8_available() -> bool:
    """Whether torchao (the float8 kernels' package) is installed."""
    return importlib.util.find_spec("torchao") is not None


def _torchao_float8():
    if not float8_available():
        raise ImportError(
            "train.amp.fp8 needs torchao's float8 training: pip install 'libai[fp8]' "
            "(or pip install torchao), or set train.amp.fp8=None"
        )
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    return Float8LinearConfig, matmul_with_hp_or_float8_args, LinearMMConfig, ScaledMMConfig


def check_recipe(recipe: Any, key: str = "train.amp.fp8") -> str | None:
    """``recipe`` checked (``None``/``False``/"" mean off); raises naming ``key``."""
    if recipe in (None, False, "", "none", "None"):
        return None
    if recipe not in FP8_RECIPES:
        raise ValueError(f"{key} must be one of {FP8_RECIPES} or None (off), got {recipe!r}")
    return recipe


def hardware_has_fp8(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` multiplies float8 natively (CUDA compute capability >= 8.9)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


@dataclass(frozen=True)
class Float8Matmul:
    """What a converted :class:`~libai.layers.Linear` needs to run its float8 matmul:
    torchao's ``Float8LinearConfig``, the per-gemm settings derived from it and torchao's
    matmul (an autograd function), looked up once here rather than in every forward."""

    recipe: str
    config: Any
    mm_config: Any
    matmul: Any

    @property
    def emulate(self) -> bool:
        return bool(self.config.emulate)

    @classmethod
    def for_recipe(cls, recipe: str, *, emulate: bool | None = None) -> Float8Matmul:
        """The matmul settings of torchao's ``recipe``; ``emulate`` None: emulate where
        the current device has no float8 matmul."""
        config_cls, matmul, mm_config_cls, scaled_mm_cls = _torchao_float8()
        config = config_cls.from_recipe_name(check_recipe(recipe))
        if emulate is None:
            emulate = not hardware_has_fp8()
        config = dataclasses.replace(config, emulate=bool(emulate))

        def gemm(gemm_config):
            return scaled_mm_cls(config.emulate, gemm_config.use_fast_accum, False, False)

        mm_config = mm_config_cls(
            gemm(config.gemm_config_output),
            gemm(config.gemm_config_grad_input),
            gemm(config.gemm_config_grad_weight),
        )
        return cls(recipe, config, mm_config, matmul)


def float8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fp8: Float8Matmul
) -> torch.Tensor:
    """``x W^T + b`` with torchao's float8 matmul; under autocast the input is cast to the
    autocast dtype first, so the output has the dtype ``F.linear`` would give."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        x = x.to(torch.get_autocast_dtype(device_type))
    elif x.dtype != weight.dtype:
        x = x.to(weight.dtype)
    shape = x.shape
    # the float8 matmul takes 2-d operands: [..., K] -> [M, K] -> [M, N] -> [..., N]
    out = fp8.matmul.apply(x.reshape(-1, shape[-1]), weight.t(), fp8.mm_config, fp8.config)
    out = out.reshape(*shape[:-1], out.shape[-1])
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out


def wants_float8(out_features: int, in_features: int, recipe: str, min_size: bool) -> bool:
    """Whether a ``[out_features, in_features]`` weight converts (the module doc's rule)."""
    if out_features % 16 or in_features % 16:
        return False
    if not min_size:
        return True
    n, k = out_features, in_features
    if recipe == "rowwise":
        return n > 2048 and k > 1024 and not (n <= 4096 and k <= 2048)
    return not (k <= 4096 and n <= 1024)


def check_fp8_layout(layout) -> None:
    """Raise, before any collective, for a layout FP8 training does not support yet."""
    if layout.tensor_parallel_size > 1:
        raise ValueError(
            f"train.amp.fp8 with tensor_parallel_size={layout.tensor_parallel_size} is not "
            "supported yet (each tp rank would scale its own shard, so the numbers would "
            "differ from one process): use data parallelism / ZeRO-1/2 with fp8, or set "
            "train.amp.fp8=None"
        )


def enable_float8_training(
    model: nn.Module,
    recipe: str,
    *,
    emulate: bool | None = None,
    min_size: bool = True,
    skip: tuple[str, ...] = (),
) -> list[str]:
    """Convert ``model``'s Linear layers that pass the filter (module doc) to float8
    matmuls: libai's :class:`~libai.layers.Linear` in place (its ``float8`` settings), a
    plain ``nn.Linear`` (an unmodified Hugging Face model's) swapped for torchao's
    ``Float8Linear`` holding the same parameters. ``skip``: names containing one of these
    stay as they are. Returns the converted layers' names (empty: nothing was large
    enough). Call it before the optimizer is built."""
    from libai.layers.linear import Linear

    fp8 = Float8Matmul.for_recipe(recipe, emulate=emulate)

    def wanted(name: str, out_features: int, in_features: int) -> bool:
        if any(s in name for s in skip):
            return False
        return wants_float8(out_features, in_features, fp8.recipe, min_size)

    converted = []
    for name, module in model.named_modules():
        if isinstance(module, Linear) and wanted(name, module.out_features, module.in_features):
            module.float8 = fp8
            converted.append(name)
    plain = [
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear and wanted(name, module.out_features, module.in_features)
    ]
    if plain:
        from torchao.float8 import convert_to_float8_training

        names = set(plain)
        convert_to_float8_training(
            model, config=fp8.config, module_filter_fn=lambda mod, fqn: fqn in names
        )
        converted += plain
    return converted
