"""The tiny GPT and batch shared by the align layout tests (single process and torchrun)."""

from __future__ import annotations

import torch

from libai.models import GPTForPreTraining

TINY_GPT = dict(
    hidden_layers=4,
    vocab_size=99,  # not a multiple of tp: the gathered logits must drop the padding
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
    embedding_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    output_dropout_prob=0.0,
)
SEED, BATCH, SEQ = 1234, 4, 12


def build_model() -> GPTForPreTraining:
    torch.manual_seed(SEED)
    return GPTForPreTraining(**TINY_GPT)


def make_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, TINY_GPT["vocab_size"], (BATCH, SEQ + 1), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
