"""The CUDA paths, on one GPU (skipped without one; CI has none): the float8 matmul on the
hardware against its emulation, the fused AdamW default, the compiled training step against
eager on NCCL's one-rank group, and static-cache decoding with CUDA graphs against the
dynamic cache and transformers. Run on the lent GPU (docs/benchmarks.md records the run)."""

from __future__ import annotations

import pytest
import torch
import transformers

from libai import dist
from libai.config import LazyCall
from libai.inference.generation import ModelStepper, generate
from libai.layers import Linear
from libai.layers import float8 as fp8_mod
from libai.models import LlamaForCausalLM
from libai.models.utils import load_huggingface
from libai.optim import build_optimizer
from libai.runtime.parallelize import parallelize
from libai.runtime.spec import AmpSpec, RunSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LLAMA = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=512,
    max_position_embeddings=128,
)


@pytest.fixture
def cuda_dist():
    dist.setup_dist_util({"device_type": "cuda"})
    yield dist.get_dist_util()
    dist.destroy_dist()


@pytest.mark.skipif(
    not (torch.cuda.is_available() and fp8_mod.hardware_has_fp8("cuda")),
    reason="needs float8 matmuls (compute capability >= 8.9)",
)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_matmul_on_the_gpu_equals_its_emulation(cuda_dist, recipe):
    """``torch._scaled_mm`` on the hardware against the emulated path (the same scaling
    and casts, the product in fp32): forward and both gradients, bf16."""
    torch.manual_seed(0)
    layer = Linear(1024, 2048, bias=False).cuda()
    x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(4, 256, 2048, device="cuda", dtype=torch.bfloat16)
    results = []
    for emulate in (True, False):
        layer.float8 = fp8_mod.Float8Matmul.for_recipe(recipe, emulate=emulate)
        layer.weight.grad = x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        out.backward(dy)
        results.append((out.float(), x.grad.float(), layer.weight.grad.float()))
    for emulated, real in zip(*results):
        scale = emulated.abs().max()
        assert (real - emulated).abs().max() / scale < 2e-2


def test_fused_adamw_is_the_default_on_cuda_and_steps_like_the_plain_one(cuda_dist):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).cuda()
    twin = torch.nn.Linear(64, 64).cuda()
    twin.load_state_dict(model.state_dict())
    fused = build_optimizer(LazyCall(torch.optim.AdamW)(lr=1e-2, weight_decay=0.1), model)
    assert fused.defaults["fused"] is True
    plain_cfg = LazyCall(torch.optim.AdamW)(lr=1e-2, weight_decay=0.1, fused=False)
    plain = build_optimizer(plain_cfg, twin)
    assert not plain.defaults["fused"]
    x = torch.randn(8, 64, device="cuda")
    for m, opt in ((model, fused), (twin, plain)):
        for _ in range(3):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(model.weight, twin.weight, rtol=1e-5, atol=1e-6)


def _train(model, compile, steps=3):
    spec = RunSpec(amp=AmpSpec(enabled=True, dtype="bf16"), num_accumulation_steps=1)
    runner = parallelize(model, spec, compile=compile).runner
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, LLAMA["vocab_size"], (2, 64), generator=g).cuda()
        losses.append(runner.forward_backward({"input_ids": ids, "labels": ids}))
        runner.optimizer_step(opt, max_grad_norm=1.0)
    return [float(x) for x in losses]


def test_compiled_blocks_train_like_eager_on_cuda(cuda_dist):
    """Per-block compile under bf16 autocast against eager, same weights and batches, on
    the one-rank NCCL group."""
    assert torch.distributed.get_backend() == "nccl"
    kwargs = dict(
        hidden_layers=2,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    torch.manual_seed(0)
    eager = LlamaForCausalLM(**kwargs).cuda()
    compiled = LlamaForCausalLM(**kwargs).cuda()
    compiled.load_state_dict(eager.state_dict())
    assert _train(compiled, True) == pytest.approx(_train(eager, False), rel=2e-2)


def test_cuda_graph_decoding_equals_the_dynamic_cache_and_transformers(cuda_dist, tmp_path):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**LLAMA, initializer_range=0.3)
    ).eval()
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path)).cuda().eval()
    hf = hf.cuda()
    ids = torch.randint(3, LLAMA["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    ids, mask = ids.cuda(), torch.ones_like(ids).cuda()
    settings = dict(max_new_tokens=24, eos_token_id=None, pad_token_id=0)
    dynamic = generate(ModelStepper(model), ids, mask, **settings)
    graphs = ModelStepper(model, compile=True, max_cache_len=32)
    assert graphs.compile_mode == "reduce-overhead"  # CUDA graphs
    first = generate(graphs, ids, mask, **settings)
    again = generate(graphs, ids, mask, **settings)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    assert torch.equal(first, dynamic) and torch.equal(again, dynamic)
    assert torch.equal(dynamic.cpu(), theirs.cpu())
