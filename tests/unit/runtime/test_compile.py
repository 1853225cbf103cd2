"""``graph.enabled`` compiles whole graphs: the zoo's blocks and models trace without a single
graph break (``torch._dynamo.explain``), also with activation checkpointing, and
``graph.enabled=None`` means compile on CUDA only."""

from __future__ import annotations

import pytest
import torch

from libai import dist
from libai.models import GPTForPreTraining, LlamaForCausalLM
from libai.runtime.core import resolve_compile


def models():
    dist.setup_dist_util({})
    torch.manual_seed(0)
    gpt = GPTForPreTraining(
        hidden_layers=2,
        vocab_size=64,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=4,
        max_seq_length=16,
    )
    llama = LlamaForCausalLM(
        hidden_layers=2,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return {"gpt": gpt, "llama": llama}


@pytest.mark.parametrize("name", ["gpt", "llama"])
@pytest.mark.parametrize("checkpointing", [False, "full", "selective"])
def test_no_graph_breaks(name, checkpointing):
    model = models()[name]
    ids = torch.randint(0, 64, (2, 8))
    blocks = [m for m in model.modules() if type(m).__name__ == "TransformerLayer"]
    for block in blocks:
        block.activation_checkpointing = checkpointing
    model.train()
    explained = torch._dynamo.explain(model)(ids, labels=ids)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    block_explained = torch._dynamo.explain(blocks[0])(torch.randn(2, 8, 32))
    assert block_explained.graph_break_count == 0
    torch._dynamo.reset()


def test_graph_enabled_none_compiles_on_cuda_only():
    assert resolve_compile(None, "cuda") is True
    assert resolve_compile(None, "cpu") is False
    assert resolve_compile(True, "cpu") is True and resolve_compile(False, "cuda") is False


def test_tensor_parallel_collectives_do_not_break_the_graph():
    from launch import torchrun

    for rank, r in enumerate(torchrun("compile_tp.py", 2)):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        assert r["block_breaks"] == 0 and r["model_breaks"] == 0, r["reasons"]
