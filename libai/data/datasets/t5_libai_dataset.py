"""LiBai's (Megatron's) T5 pretraining samples: span masking over whole words, sentinels.

What LiBai's ``configs/common/data/t5_dataset.py`` builds (``T5Dataset(masked_lm_prob=...,
short_seq_prob=...)``): the sample index is BERT's without the sentence pair (runs of whole
sentences of a document, ``max_seq_length - 2`` tokens, shorter with probability
``short_seq_prob``; :class:`~libai.data.datasets.bert_dataset.BertDataset` with
``binary_head=False``). In a run, ``masked_lm_prob`` of the tokens are hidden in spans of
whole words (a word is a WordPiece start and its ``##`` pieces): each span starts at a
random word and covers ``min(Geometric(0.2), 10)`` words, shortened to fit the budget and
skipped when it overlaps an earlier one (SpanBERT's lengths, Megatron's
``masking_style="t5"``). Span ``k`` (from the left) becomes sentinel ``k`` in the encoder
input; the decoder reads ``[BOS]`` then, per span, its sentinel and its tokens, and
predicts the same shifted by one with ``[EOS]`` at the end::

    tokens         : a  b c  d e  f g         (spans "b c" and "f g")
    encoder        : a <X0> d e <X1>
    decoder input  : [BOS] <X0> b c <X1> f g
    lm_labels      : <X0> b c <X1> f g [EOS]

Masks are LiBai's extended ones (bool, True = attend): ``encoder_attn_mask`` ``[src, src]``,
``decoder_attn_mask`` ``[tgt, tgt]`` (causal and padding) and
``encoder_decoder_attn_mask`` ``[tgt, src]``. Padded label positions hold -100 (LiBai: -1)
and ``loss_mask`` 0.
"""

from __future__ import annotations

import numpy as np
import torch

from libai.data.datasets.bert_dataset import BertDataset
from libai.data.datasets.lm_utils import IGNORE_INDEX, pad_to, token_id
from libai.data.datasets.t5_dataset import resolve_sentinel_ids

#: SpanBERT's geometric span length (in words) and its cap, as LiBai's T5 masking
SPAN_GEOMETRIC_P = 0.2
MAX_SPAN_WORDS = 10


def word_groups(tokens: np.ndarray, is_continuation: np.ndarray, skip_ids=()) -> list[list[int]]:
    """Positions of ``tokens`` grouped into whole words: a ``##`` piece joins the word
    before it (``is_continuation[id]``); ids in ``skip_ids`` belong to no word."""
    words: list[list[int]] = []
    for i, tok in enumerate(tokens.tolist()):
        if tok in skip_ids:
            continue
        if words and is_continuation[tok]:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def sample_spans(words: list[list[int]], budget: int, rng: np.random.Generator) -> list[list[int]]:
    """Masked spans (lists of positions), left to right, at most ``budget`` positions in
    all: starting words in random order, each span ``min(Geometric(0.2), 10)`` words from
    its start, shortened until it fits the budget, skipped if it cannot or if it overlaps a
    span already taken."""
    covered: set[int] = set()
    spans, count = [], 0
    for start in rng.permutation(len(words)).tolist():
        if count >= budget:
            break
        n = min(int(rng.geometric(SPAN_GEOMETRIC_P)), MAX_SPAN_WORDS)
        positions: list[int] = []
        while n > 0:
            positions = [p for word in words[start : start + n] for p in word]
            if count + len(positions) <= budget:
                break
            n -= 1
        if n == 0 or covered.intersection(positions):
            continue
        covered.update(positions)
        spans.append(positions)
        count += len(positions)
    return sorted(spans, key=lambda span: span[0])


def build_t5_sample(tokens, spans, sentinels, bos_id: int, eos_id: int):
    """``(encoder_ids, decoder_input_ids, labels)`` of ``tokens`` with ``spans`` hidden."""
    enc, dec_in, labels, start = [], [bos_id], [], 0
    for sentinel, span in zip(sentinels, spans):
        hidden = [int(tokens[p]) for p in span]
        dec_in += [int(sentinel), *hidden]
        labels += [int(sentinel), *hidden]
        enc += [int(t) for t in tokens[start : span[0]]] + [int(sentinel)]
        start = span[-1] + 1
    enc += [int(t) for t in tokens[start:]]
    labels.append(eos_id)
    return enc, dec_in, labels


class LiBaiT5Dataset(BertDataset):
    """LiBai's T5 dataset (see the module docstring); what ``T5Dataset`` builds when given
    LiBai's ``masked_lm_prob`` / ``short_seq_prob``.

    Args (LiBai's names): ``name``, ``tokenizer`` (ids ``cls``, ``sep``, ``mask``, ``pad``,
    ``bos``, ``eos``, sentinels ``<extra_id_k>`` among its additional special tokens and
    ``##`` WordPiece continuations, e.g. LiBai's ``BertTokenizer`` config), ``data_prefix``,
    ``indexed_dataset``, ``max_num_samples``, ``masked_lm_prob``, ``max_seq_length``
    (encoder), ``max_seq_length_dec`` (decoder), ``short_seq_prob``, ``seed``; keyword-only
    ``documents`` / ``num_samples`` as every indexed dataset here.
    """

    def __init__(
        self,
        name: str = "t5",
        tokenizer=None,
        data_prefix: str | None = None,
        indexed_dataset=None,
        max_num_samples: int | None = None,
        masked_lm_prob: float = 0.15,
        max_seq_length: int = 512,
        max_seq_length_dec: int = 128,
        short_seq_prob: float = 0.0,
        seed: int = 1234,
        *,
        documents=None,
        num_samples: int | None = None,
    ):
        super().__init__(
            name,
            tokenizer,
            data_prefix,
            indexed_dataset,
            max_num_samples,
            max_seq_length,
            masked_lm_prob,
            short_seq_prob,
            seed,
            binary_head=False,
            documents=documents,
            num_samples=num_samples,
        )
        self.max_seq_length_dec = int(max_seq_length_dec)
        self.bos_id = token_id(tokenizer, "bos", self.owner)
        self.eos_id = token_id(tokenizer, "eos", self.owner)
        sentinels = resolve_sentinel_ids(tokenizer, None, self.owner)
        if not sentinels or callable(sentinels):
            raise ValueError(
                f"{self.owner}: the tokenizer has no sentinel tokens; give it "
                "additional_special_tokens=['<extra_id_0>', ...] as LiBai's t5 config does."
            )
        self.sentinel_ids = list(sentinels)
        vocab = tokenizer.get_vocab()
        self.is_continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for token, index in vocab.items():
            self.is_continuation[index] = token.startswith("##")

    def _init_kwargs(self) -> dict:
        return dict(
            tokenizer=self.tokenizer,
            data_prefix=self.data_prefix,
            masked_lm_prob=self.mask_lm_prob,
            max_seq_length=self.max_seq_length,
            max_seq_length_dec=self.max_seq_length_dec,
            short_seq_prob=self.short_seq_prob,
            seed=self.seed,
        )

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        first, last, target = (int(x) for x in self.samples_mapping[idx])
        tokens = np.concatenate([self.indexed_dataset.get(i) for i in range(first, last)])
        tokens = tokens[:target].astype(np.int64)
        rng = self.sample_rng(idx)
        words = word_groups(tokens, self.is_continuation, {self.cls_id, self.sep_id})
        budget = min(self.mask_lm_prob * target, max(1, round(len(tokens) * self.mask_lm_prob)))
        spans = sample_spans(words, int(budget), rng)
        if len(spans) > len(self.sentinel_ids):
            raise ValueError(
                f"{self.owner}: a sample has {len(spans)} spans but the tokenizer has only "
                f"{len(self.sentinel_ids)} sentinel tokens; add more <extra_id_k> tokens."
            )
        enc, dec_in, labels = build_t5_sample(
            tokens, spans, self.sentinel_ids, self.bos_id, self.eos_id
        )
        s_enc, s_dec = self.max_seq_length, self.max_seq_length_dec
        if len(dec_in) > s_dec:
            raise ValueError(
                f"{self.owner}: sample {idx} has {len(dec_in)} decoder tokens, more than "
                f"max_seq_length_dec={s_dec}; raise max_seq_length_dec or lower masked_lm_prob."
            )
        real_enc = torch.arange(s_enc) < len(enc)
        real_dec = torch.arange(s_dec) < len(dec_in)
        causal = torch.ones(s_dec, s_dec, dtype=torch.bool).tril()
        return {
            "encoder_input_ids": pad_to(enc, s_enc, self.pad_id),
            "decoder_input_ids": pad_to(dec_in, s_dec, self.pad_id),
            "encoder_attn_mask": real_enc[:, None] & real_enc[None, :],
            "decoder_attn_mask": real_dec[:, None] & real_dec[None, :] & causal,
            "encoder_decoder_attn_mask": real_dec[:, None] & real_enc[None, :],
            "lm_labels": pad_to(labels, s_dec, IGNORE_INDEX),
            "loss_mask": pad_to(np.ones(len(labels), np.int64), s_dec, 0),
        }
