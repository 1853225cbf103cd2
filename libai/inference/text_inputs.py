"""Token ids of a batch of texts, padded into the tensors BERT-style models take."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def encode_texts(tokenizer, texts: Sequence[str], device=None) -> dict[str, torch.Tensor]:
    """``{"input_ids", "attention_mask", "tokentype_ids"}`` of ``texts`` with the model's
    framing tokens (``[CLS] x [SEP]``, ``<s> x </s>``), right-padded with the tokenizer's pad
    id to the longest text; ``attention_mask`` is 1 on real tokens."""
    if tokenizer is None:
        raise ValueError("this pipeline needs a tokenizer (config `tokenization` or model dir)")
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"expected text inputs (str), got {type(text).__name__}")
    ids = tokenizer.encode_batch(list(texts), add_special_tokens=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "tokentype_ids": torch.zeros_like(input_ids),
    }
    return {k: v.to(device) for k, v in batch.items()} if device is not None else batch
