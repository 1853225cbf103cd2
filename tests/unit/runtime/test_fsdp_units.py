"""FSDP2's units of Hugging Face models with tied weights, in one process
(:func:`libai.runtime.fsdp.blocks_tied_to_root_merged`): a block that shares a parameter with
the model root joins the root's unit, named in the log with the shared parameter; blocks
that share nothing with the root stay."""

from __future__ import annotations

import logging

import transformers
from layer_helpers import single_process  # noqa: F401  (autouse fixture)

from libai.runtime.blocks import model_blocks
from libai.runtime.fsdp import blocks_tied_to_root_merged, check_fsdp_units

TINY_BERT = dict(
    vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
)


def test_the_embedding_block_a_head_ties_joins_the_root(caplog):
    model = transformers.BertForPreTraining(transformers.BertConfig(**TINY_BERT))
    blocks = model_blocks(model)
    assert blocks == [model.bert.embeddings, *model.bert.encoder.layer]
    with caplog.at_level(logging.INFO, logger="libai.runtime.fsdp"):
        units = blocks_tied_to_root_merged(model, blocks)
    assert units == list(model.bert.encoder.layer)
    check_fsdp_units(model, units)  # every parameter in exactly one unit
    messages = [r.getMessage() for r in caplog.records if r.name == "libai.runtime.fsdp"]
    assert messages == [
        "ZeRO-3: block bert.embeddings shares bert.embeddings.word_embeddings.weight with the "
        "model root (tied weights); its parameters are sharded in the root's unit"
    ]


def test_blocks_that_share_nothing_with_the_root_stay(caplog):
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=8)
    model = transformers.GPT2LMHeadModel(config)  # the head ties wte, which is on the root
    blocks = model_blocks(model)
    with caplog.at_level(logging.INFO, logger="libai.runtime.fsdp"):
        assert blocks_tied_to_root_merged(model, blocks) == blocks == list(model.transformer.h)
    assert [r for r in caplog.records if r.name == "libai.runtime.fsdp"] == []
