"""Several adapters on one layer, chosen per token (libai.layers.lora_set), against the
adapters applied row by row: a Linear and a token embedding, the tokens of each adapter in
one run of rows (the engine's order) or interleaved, tokens of no adapter left as the base
computes them, and no adapter outside a route."""

from __future__ import annotations

import pytest
import torch
from layer_helpers import randn, single_process  # noqa: F401 (single_process: autouse)

from libai.layers import Linear, VocabEmbedding
from libai.layers.lora import EmbeddingLoRA, LoRA
from libai.layers.lora_set import AdapterRouting, AdapterSet


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def _layer(kind: str):
    """(the base layer, its two adapters, an input of 6 tokens)."""
    if kind == "linear":
        base = Linear(8, 5, bias=True)
        adapters = [LoRA(base, 2, 4.0), LoRA(base, 3, 3.0, use_rslora=True)]
        x = randn(1, 6, 8, seed=1)
    else:
        base = VocabEmbedding(11, 5)
        adapters = [EmbeddingLoRA(base, 2, 4.0), EmbeddingLoRA(base, 3, 3.0)]
        x = torch.tensor([[3, 0, 10, 7, 3, 5]])
    for i, a in enumerate(adapters):
        _randomize(a, seed=10 + i)
    return base, adapters, x


@pytest.mark.parametrize("kind", ["linear", "embedding"])
@pytest.mark.parametrize(
    "slots", [[0, 0, 1, 1, 1, -1], [0, 1, 0, -1, 1, 1], [-1, -1, -1, -1, -1, -1]]
)
def test_each_token_goes_through_its_adapter(kind, slots):
    base, adapters, x = _layer(kind)
    with torch.no_grad():
        plain = base(x)
        want = plain.clone()
        for t, slot in enumerate(slots):
            if slot >= 0:
                want[0, t] += adapters[slot](x[:, t : t + 1])[0, 0]
        routing = AdapterRouting(["a", "b"])
        base.lora = AdapterSet(dict(enumerate(adapters)), routing)
        with routing.route(torch.tensor(slots)):
            got = base(x)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(base(x), plain, atol=0, rtol=0)  # outside a route: the base


def test_an_adapter_that_skips_the_layer_and_bad_indices():
    base, adapters, x = _layer("linear")
    routing = AdapterRouting(["a", "b"])
    base.lora = AdapterSet({1: adapters[1]}, routing)  # "a" does not target this layer
    with torch.no_grad():
        with routing.route(torch.tensor([0, 0, 0, 1, 1, 1])):
            got = base(x)
        base.lora = None
        expected = base(x)
        expected[0, 3:] += adapters[1](x[:, 3:])[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="adapter index 2 out of range: 2 adapters loaded"):
        with routing.route(torch.tensor([0, 2])):
            pass
    base.lora = AdapterSet({1: adapters[1]}, routing)
    with pytest.raises(ValueError, match="routed for 3 tokens, the layer got 6"):
        with routing.route(torch.tensor([1, 1, 1])), torch.no_grad():
            base(x)
