"""Single-process layers against independent references: RoPE frequencies and tables against
transformers' Llama rotary embedding (``ROPE_INIT_FUNCTIONS``, ``LlamaRotaryEmbedding``), the
relative position bias against T5's ``T5Attention.compute_bias`` on the same table, and the
sinusoidal table, drop path, activations, soft-target cross entropy, MLP and vocab embedding
against formulas written here; selective checkpointing against plain autograd (gradients)
and against its documented policy (every second matrix multiply is recomputed)."""

from __future__ import annotations

import enum
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from layer_helpers import randn, single_process  # noqa: F401 (single_process: an autouse fixture)
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.activations import QuickGELUActivation
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5Attention

from libai import dist
from libai.layers import (
    MLP,
    Embedding,
    RotaryEmbedding,
    SinePositionalEmbedding,
    VocabEmbedding,
    build_activation,
    drop_path,
    rope_inv_freq,
)
from libai.layers.checkpointing import checkpointed
from libai.layers.relative_position import RelativePositionBias
from libai.layers.rotary import rope_type
from libai.layers.soft_target_cross_entropy import SoftTargetCrossEntropy

HEAD_SIZE, THETA, MAX_POS = 64, 5e5, 32


def llama_config(rope_parameters: dict, max_position_embeddings: int = MAX_POS):
    config = transformers.LlamaConfig(
        hidden_size=2 * HEAD_SIZE,
        num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=THETA,
    )
    config.rope_parameters = {"rope_theta": THETA, **rope_parameters}
    return config


# ---- rotary -----------------------------------------------------------------------------------


def test_llama3_rope_without_original_max_positions_uses_max_position_embeddings():
    """transformers fills a missing ``original_max_position_embeddings`` of llama3 scaling with
    ``max_position_embeddings``; libai's frequencies (function and module) agree."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    config = llama_config(dict(scaling), max_position_embeddings=64)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert config.rope_parameters["original_max_position_embeddings"] == 64
    default, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    assert not torch.allclose(want, default)  # the scaling changes some frequencies
    got = rope_inv_freq(HEAD_SIZE, THETA, dict(scaling), max_position_embeddings=64)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    rope = RotaryEmbedding(HEAD_SIZE, THETA, scaling=dict(scaling), max_position_embeddings=64)
    torch.testing.assert_close(rope.inv_freq, want, rtol=0, atol=0)


def test_rope_parameters_without_a_type_are_the_default_rope():
    """A ``rope_parameters`` dict naming no type (only ``rope_theta``) is the plain RoPE, as
    transformers reads it."""
    scaling = {"rope_theta": THETA}
    assert rope_type(scaling) == "default"
    want, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(llama_config({}))
    rope = RotaryEmbedding(HEAD_SIZE, THETA, scaling=scaling, max_position_embeddings=MAX_POS)
    torch.testing.assert_close(rope.inv_freq, want, rtol=0, atol=0)


@pytest.mark.parametrize("last_position", [MAX_POS - 1, MAX_POS, 100])
def test_dynamic_rope_tables_match_transformers(last_position):
    """Dynamic NTK RoPE: positions up to ``last_position`` (below, just beyond and far beyond
    ``max_position_embeddings``) give transformers' cos / sin (a fresh HF module per call:
    libai keeps no state between calls)."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    hf = LlamaRotaryEmbedding(llama_config(dict(scaling)))
    positions = torch.tensor([[0, 3, last_position - 2, last_position], [1, 2, 5, 7]])
    want_cos, want_sin = hf(torch.zeros(1), positions)
    rope = RotaryEmbedding(HEAD_SIZE, THETA, scaling=scaling, max_position_embeddings=MAX_POS)
    cos, sin = rope(positions)
    torch.testing.assert_close(cos, want_cos)
    torch.testing.assert_close(sin, want_sin)
    plain_cos, _ = RotaryEmbedding(HEAD_SIZE, THETA)(positions)
    # beyond max_position_embeddings the frequencies are rescaled, below they are not
    assert torch.allclose(plain_cos, want_cos) == (last_position < MAX_POS)


# ---- relative position bias -------------------------------------------------------------------


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_relative_position_bias_defaults_match_t5(decoder):
    """Default buckets / max distance are T5's (``T5Config()``); the bias equals
    ``T5Attention.compute_bias`` on the same table, distances past ``max_distance`` included."""
    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=4, is_decoder=decoder)
    torch.manual_seed(0)
    hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    bias = RelativePositionBias(config.num_heads, bidirectional=not decoder)
    with torch.no_grad():
        bias.weight.copy_(hf.relative_attention_bias.weight)
    past = 3 if decoder else 0
    want = hf.compute_bias(5, 300, past_seen_tokens=past)
    torch.testing.assert_close(bias(5, 300, past_length=past), want, rtol=0, atol=0)


def test_relative_position_bias_is_computed_on_the_tables_device():
    """Query and key positions are made on the table's device (a ``meta`` table: shapes only,
    no CPU tensors mixed in)."""
    bias = RelativePositionBias(4, num_buckets=8, max_distance=16).to("meta")
    out = bias(3, 5, past_length=2)
    assert out.device.type == "meta"
    assert out.shape == (1, 4, 3, 5)


# ---- sinusoidal position embedding ------------------------------------------------------------


@pytest.mark.parametrize("dim", [8, 7])
def test_sine_positional_embedding_is_the_vaswani_table(dim):
    """Row ``p``: ``sin(p / 10000^(2i/d))`` at column ``2i``, ``cos`` of the same at ``2i+1``."""
    n = 20
    want = torch.zeros(n, dim, dtype=torch.float64)
    for p in range(n):
        for col in range(dim):
            angle = p / 10000.0 ** (2 * (col // 2) / dim)
            want[p, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    emb = SinePositionalEmbedding(n, dim)
    ids = torch.tensor([[0, 5, 19], [1, 2, 3]])
    got = emb(ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want[ids], rtol=0, atol=1e-5)
    assert set(emb.state_dict()) == {"position_embedding"}


# ---- drop path --------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_by_keep", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drop_path_keeps_or_zeroes_whole_samples(scale_by_keep, dtype):
    """timm's stochastic depth: each sample is either zeroed or kept whole, the kept ones
    multiplied by ``1 / keep`` when ``scale_by_keep``; about ``keep`` of them are kept; the
    output has the input's dtype."""
    drop_prob = 0.5
    keep = 1.0 - drop_prob
    x = randn(64, 3, 4).to(dtype)
    torch.manual_seed(0)
    out = drop_path(x, drop_prob, training=True, scale_by_keep=scale_by_keep)
    assert out.dtype == dtype
    kept = out.flatten(1).ne(0).any(dim=1)
    scale = 1.0 / keep if scale_by_keep else 1.0
    want = torch.where(kept[:, None, None], x * scale, torch.zeros_like(x))
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert 16 <= int(kept.sum()) <= 48  # Binomial(64, 0.5): mean 32, sd 4
    assert torch.equal(drop_path(x, drop_prob, training=False), x)


# ---- activations ------------------------------------------------------------------------------


REFERENCE_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.01),
    "squared_relu": lambda x: F.relu(x) ** 2,
    "tanh": torch.tanh,
    "quick_gelu": QuickGELUActivation(),  # CLIP's, as transformers has it
    "silu": F.silu,
}


@pytest.mark.parametrize("name", sorted(REFERENCE_ACTIVATIONS))
def test_activation_modules_match_reference_functions(name):
    x = 3 * randn(5, 7)
    torch.testing.assert_close(build_activation(name)(x), REFERENCE_ACTIVATIONS[name](x))


def test_build_activation_accepts_enum_members_and_empty_names():
    class Act(enum.Enum):
        GELU = "gelu"

    class StrAct(str, enum.Enum):
        SILU = "silu"

    assert type(build_activation(Act.GELU)) is nn.GELU
    assert type(build_activation(StrAct.SILU)) is nn.SiLU
    assert type(build_activation(None)) is nn.Identity
    assert type(build_activation("")) is nn.Identity
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        build_activation("swish")


# ---- soft-target cross entropy ----------------------------------------------------------------


def test_soft_target_cross_entropy_matches_the_formula():
    """``mean_b sum_c -t log_softmax``; class ids are one-hot targets (= ``F.cross_entropy``)."""
    logits = 2 * randn(6, 5)
    soft = torch.softmax(randn(6, 5, seed=1), dim=-1)
    loss = SoftTargetCrossEntropy()
    want = (-(soft * torch.log_softmax(logits.double(), dim=-1)).sum(-1)).mean()
    torch.testing.assert_close(loss(logits, soft).double(), want, rtol=1e-6, atol=1e-6)
    ids = torch.tensor([0, 4, 2, 2, 1, 3])
    torch.testing.assert_close(loss(logits, ids), F.cross_entropy(logits, ids))
    one_hot = F.one_hot(ids, 5).float()
    torch.testing.assert_close(loss(logits, ids), loss(logits, one_hot))


# ---- layer placement under a pipeline layout --------------------------------------------------


@pytest.fixture
def four_layer_layout():
    """A single-process layout that names the model's 4 pipeline layers (all on stage 0)."""
    yield dist.setup_dist_util({"pipeline_num_layers": 4})
    dist.setup_dist_util({})


def test_mlp_and_vocab_embedding_are_placed_by_their_layer_idx(four_layer_layout):
    """Every weight of the layer belongs to the layer it is built for: the last layer builds and
    computes the plain formula, a layer past the last one is rejected."""
    torch.manual_seed(0)
    mlp = MLP(8, 16, layer_idx=3)
    x = randn(2, 3, 8)
    up, down = mlp.dense_h_to_4h, mlp.dense_4h_to_h
    want = F.linear(F.gelu(F.linear(x, up.weight, up.bias)), down.weight, down.bias)
    torch.testing.assert_close(mlp(x), want)
    with pytest.raises(IndexError, match="layer_idx 4 out of range"):
        MLP(8, 16, layer_idx=4)
    emb = VocabEmbedding(10, 8, layer_idx=3)
    ids = torch.tensor([[0, 9, 3]])
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    with pytest.raises(IndexError, match="layer_idx 4 out of range"):
        VocabEmbedding(10, 8, layer_idx=4)


def test_sequence_parallel_embedding_in_one_process_is_the_plain_lookup():
    """With one tensor-parallel rank this rank's share of the sequence is all of it."""
    torch.manual_seed(0)
    emb = Embedding(12, 8, sequence_parallel=True)
    ids = torch.tensor([[0, 11, 3, 3], [5, 6, 7, 8]])
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight), rtol=0, atol=0)


# ---- selective activation checkpointing -------------------------------------------------------


def _four_matmuls(x, weights, scale=1.0):
    for w in weights:
        x = torch.tanh(x @ w)
    return x.sum() * scale


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _grads_and_backward_matmuls(mode):
    x = randn(3, 6).requires_grad_()
    weights = [randn(6, 6, seed=k + 1).requires_grad_() for k in range(4)]
    if mode is None:
        loss = _four_matmuls(x, weights, scale=3.0)
    else:
        loss = checkpointed(_four_matmuls, mode, x, weights, scale=3.0)
    with _CountMatmuls() as counter:
        loss.backward()
    return loss, [x.grad, *(w.grad for w in weights)], counter.count


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_gives_plain_gradients_and_recomputes_per_policy(mode):
    """Same loss (keyword arguments passed on) and gradients as plain autograd; in backward,
    "full" recomputes the 4 matrix multiplies, "selective" every second one (2)."""
    want_loss, want_grads, plain_mms = _grads_and_backward_matmuls(None)
    loss, grads, mms = _grads_and_backward_matmuls(mode)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=0)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert mms - plain_mms == {"full": 4, "selective": 2}[mode]
