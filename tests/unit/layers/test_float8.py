"""FP8 training (``train.amp.fp8``; libai/layers/float8.py) on one process, float8 matmuls
emulated on the CPU: a converted Linear against the float8 quantization formula written out
here, the layer filter against torchao's own, a 50-step tiny run against bf16, and the
errors (wrong recipe, tensor parallelism, torchao missing)."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch
import torch.nn.functional as F
from fp8_cases import build, train

from libai import dist
from libai.layers import Linear
from libai.layers import float8 as fp8_mod
from libai.runtime.spec import RunSpec

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantized(t: torch.Tensor, dtype, dim=None, pow2=False) -> torch.Tensor:
    """``t`` scaled by max(dtype) / amax (over ``dim``, else the whole tensor), cast to the
    float8 ``dtype`` with saturation, and scaled back (fp32)."""
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = (torch.finfo(dtype).max / amax.double().clamp(min=1e-12)).float()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    limit = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-limit, limit).to(dtype).float() / scale


@pytest.fixture
def layer():
    dist.setup_dist_util({})
    torch.manual_seed(0)
    return Linear(64, 48, bias=True)


def _input():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(2, 5, 64, generator=g) * torch.linspace(0.1, 4, 64)).requires_grad_()


def test_tensorwise_forward_and_both_gradients_follow_the_formula(layer):
    """Output: q(x) q(W)^T + b with one e4m3 scale per tensor; input gradient
    q5(dy) q(W); weight gradient q5(dy)^T q(x) (e5m2 for the gradient)."""
    x, w = _input(), layer.weight.detach()
    plain = F.linear(x, w, layer.bias)
    converted = fp8_mod.enable_float8_training(layer, "tensorwise", emulate=True, min_size=False)
    assert converted == [""] and layer.float8.emulate
    out = layer(x)
    x2 = x.detach().reshape(-1, 64)
    want = quantized(x2, E4M3) @ quantized(w, E4M3).t() + layer.bias.detach()
    torch.testing.assert_close(out.reshape(-1, 48), want, rtol=1e-6, atol=1e-6)
    assert (out - plain).abs().max() > 1e-3  # the float8 rounding is really there
    dy = torch.randn_like(out)
    out.backward(dy)
    dy2 = dy.reshape(-1, 48)
    want_dx = quantized(dy2, E5M2) @ quantized(w, E4M3)
    want_dw = quantized(dy2, E5M2).t() @ quantized(x2, E4M3)
    torch.testing.assert_close(x.grad.reshape(-1, 64), want_dx, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(layer.weight.grad, want_dw, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, dy2.sum(0))


def test_rowwise_forward_scales_each_row_by_a_power_of_two(layer):
    x, w = _input(), layer.weight.detach()
    fp8_mod.enable_float8_training(layer, "rowwise", emulate=True, min_size=False)
    out = layer(x).reshape(-1, 48)
    x2 = x.detach().reshape(-1, 64)
    want = quantized(x2, E4M3, dim=-1, pow2=True) @ quantized(w, E4M3, dim=-1, pow2=True).t()
    torch.testing.assert_close(out, want + layer.bias.detach(), rtol=1e-6, atol=1e-6)
    tensorwise = quantized(x2, E4M3) @ quantized(w, E4M3).t() + layer.bias.detach()
    assert (out - tensorwise).abs().max() > 1e-4  # per-row scales, not one per tensor


def test_autocast_gives_the_dtype_f_linear_gives(layer):
    fp8_mod.enable_float8_training(layer, "tensorwise", emulate=True, min_size=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(_input()).dtype == torch.bfloat16
    assert layer(_input()).dtype == torch.float32


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_the_layer_filter_is_torchaos_auto_filter(recipe):
    """Which [out, in] weights convert, over the sizes around every threshold, equals
    torchao's own filter for ``nn.Linear`` of that shape."""
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    theirs = _auto_filter_for_recipe(recipe, filter_fqns=[])
    sizes = [24, 512, 1000, 1024, 1040, 2048, 2064, 4096, 4112, 8192]
    for out_features in sizes:
        for in_features in sizes:
            linear = torch.nn.Linear(in_features, out_features, device="meta")
            ours = fp8_mod.wants_float8(out_features, in_features, recipe, min_size=True)
            assert ours == theirs(linear, "layer"), (recipe, out_features, in_features)


def test_a_llama_1b_block_converts_its_large_layers_and_skips_named_ones():
    """Llama-3.2-1B shapes (hidden 2048, ffn 8192, 8 kv heads): under rowwise the MLP's
    two up-projections [8192, 2048] convert; the fused QKV [3072, 2048], the attention
    output [2048, 2048] and the down-projection [2048, 8192] are too small (out <= 2048 or
    both out <= 4096 and in <= 2048). ``skip`` leaves matching names out."""
    dist.setup_dist_util({})
    from libai.layers.mlp import MLP

    with torch.device("meta"):
        block = torch.nn.ModuleDict(
            {
                "qkv": Linear(2048, 3072, bias=False, parallel="col"),
                "dense": Linear(2048, 2048, bias=False, parallel="row"),
                "mlp": MLP(2048, 8192, bias=False, gated=True, activation="silu"),
            }
        )
    names = fp8_mod.enable_float8_training(block, "rowwise", emulate=True)
    assert names == ["mlp.dense_h_to_4h", "mlp.dense_gate"]  # 4h_to_h: out 2048
    for module in block.modules():
        module.float8 = None
    names = fp8_mod.enable_float8_training(block, "tensorwise", emulate=True, skip=("gate",))
    assert names == ["qkv", "dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]


def test_fifty_steps_of_fp8_stay_within_one_percent_of_bf16():
    """The issue's CPU criterion: a 50-step tiny run under bf16 autocast, its losses with
    fp8 within 1 % of bf16's at every step (4 batches in turn, so the loss falls), and not equal to them (float8 is in use)."""
    dist.setup_dist_util({})
    bf16 = train(*build(None, autocast=True), 50, cycle=4)
    for recipe in ("tensorwise", "rowwise"):
        fp8 = train(*build(recipe, autocast=True), 50, cycle=4)
        assert fp8 == pytest.approx(bf16, rel=0.01), recipe
        assert max(abs(a - b) for a, b in zip(fp8, bf16)) > 1e-4, recipe
    assert bf16[-1] < bf16[0] - 0.3  # it learns


def test_wrong_recipe_tensor_parallel_and_missing_torchao_raise_with_the_fix(monkeypatch):
    with pytest.raises(ValueError, match=r"train\.amp\.fp8 must be one of \('rowwise', 'tens"):
        RunSpec.from_config({"amp": {"fp8": "rowise"}})
    assert RunSpec.from_config({"amp": {"fp8": None}}).amp.fp8_recipe() is None
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported yet"):
        fp8_mod.check_fp8_layout(types.SimpleNamespace(tensor_parallel_size=2))
    fp8_mod.check_fp8_layout(types.SimpleNamespace(tensor_parallel_size=1))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'libai\[fp8\]'"):
        fp8_mod.Float8Matmul.for_recipe("rowwise")


def test_emulation_follows_the_device():
    assert not fp8_mod.hardware_has_fp8("cpu")
    assert fp8_mod.Float8Matmul.for_recipe("tensorwise").emulate == (not fp8_mod.hardware_has_fp8())
    assert not fp8_mod.Float8Matmul.for_recipe("tensorwise", emulate=False).emulate


def test_a_hugging_face_model_gets_torchaos_float8_linear_except_its_head():
    """Rapidformer's door trains unmodified Hugging Face models: their ``nn.Linear`` layers
    become torchao's ``Float8Linear`` over the same parameters, the lm_head stays."""
    import transformers
    from torchao.float8.float8_linear import Float8Linear

    from libai.runtime.parallelize import parallelize
    from libai.runtime.spec import AmpSpec

    dist.setup_dist_util({})
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = float(hf(input_ids=ids, labels=ids).loss)
    up = hf.model.layers[0].mlp.up_proj.weight
    spec = RunSpec(amp=AmpSpec(fp8="tensorwise", fp8_min_size=False), num_accumulation_steps=1)
    parallelize(hf, spec)
    assert type(hf.lm_head) is torch.nn.Linear
    linears = [m for m in hf.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(isinstance(m, Float8Linear) for m in linears) == 14 == len(linears) - 1
    assert hf.model.layers[0].mlp.up_proj.weight is up
    fp8 = float(hf(input_ids=ids, labels=ids).loss)
    assert fp8 == pytest.approx(plain, rel=0.01) and fp8 != plain


def test_off_spellings_and_a_bad_value(monkeypatch):
    for off in (None, False, "", "none", "None"):
        assert fp8_mod.check_recipe(off) is None
    for bad in (True, "NONE", "Rowwise"):
        with pytest.raises(ValueError, match="train.amp.fp8 must be one of"):
            fp8_mod.check_recipe(bad)
    assert fp8_mod.check_recipe("rowwise", key="Engine.mix_precision.fp8") == "rowwise"
    with pytest.raises(ValueError, match="Engine.mix_precision.fp8 must be"):
        fp8_mod.check_recipe("x", key="Engine.mix_precision.fp8")


def test_float8_hardware_is_cuda_from_compute_capability_8_9(monkeypatch):
    asked = []
    capability = {"value": (9, 0)}

    def get_capability(device=None):
        asked.append(device)
        return capability["value"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", get_capability)
    assert fp8_mod.hardware_has_fp8() and fp8_mod.hardware_has_fp8("cuda:1")
    assert asked == [torch.device("cuda"), torch.device("cuda", 1)]
    assert not fp8_mod.hardware_has_fp8("cpu")
    for value, has in [((8, 9), True), ((8, 6), False), ((8, 10), True), ((9, 9), True)]:
        capability["value"] = value
        assert fp8_mod.hardware_has_fp8("cuda") is has, value
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not fp8_mod.hardware_has_fp8("cuda") and not fp8_mod.hardware_has_fp8()


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_the_gemm_settings_are_those_torchaos_float8_linear_builds(recipe):
    """The three gemms' settings (emulation, fast accumulation, padding) equal those of
    torchao's own ``Float8Linear`` for the same config."""
    from torchao.float8.float8_linear import Float8Linear

    for emulate in (True, False):
        ours = fp8_mod.Float8Matmul.for_recipe(recipe, emulate=emulate)
        assert ours.config.emulate is emulate and ours.recipe == recipe
        theirs = Float8Linear.from_float(torch.nn.Linear(32, 32), config=ours.config)
        assert ours.mm_config == theirs.linear_mm_config
        assert ours.config == torchao_config(recipe, emulate)


def torchao_config(recipe, emulate):
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def test_conversion_passes_emulate_and_names_both_kinds_of_linear():
    """``emulate`` reaches every converted layer, libai's and a plain ``nn.Linear`` (torchao's
    ``Float8Linear`` then carries the recipe's config); the names of both are returned."""
    from torchao.float8.float8_linear import Float8Linear

    dist.setup_dist_util({})
    model = torch.nn.ModuleDict({"ours": Linear(32, 32), "plain": torch.nn.Linear(32, 32)})
    names = fp8_mod.enable_float8_training(model, "rowwise", emulate=False, min_size=False)
    assert names == ["ours", "plain"]
    assert model["ours"].float8.emulate is False
    assert isinstance(model["plain"], Float8Linear)
    assert model["plain"].config == torchao_config("rowwise", False)


def test_mixed_input_dtypes_and_autocast_behave_as_f_linear(layer):
    """Without autocast a bf16 input meets fp32 weights in fp32 (the output is fp32); under
    autocast the layer keeps its input for backward in the autocast dtype, as F.linear
    does (half the activation memory)."""
    fp8_mod.enable_float8_training(layer, "tensorwise", emulate=True, min_size=False)
    x = _input().detach()
    assert layer(x.bfloat16()).dtype == torch.float32
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x.requires_grad_())
    inputs = [dtype for shape, dtype in saved if shape == (10, 64)]
    assert inputs and set(inputs) == {torch.bfloat16}
