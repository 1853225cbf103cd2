"""LiBai's T5 dataset (T5Dataset with LiBai's masked_lm_prob / short_seq_prob keywords):
every sample checked against the corpus it was cut from -- putting each sentinel's span back
gives the run's text, spans are whole words within LiBai's budget, the decoder input is
[BOS] + labels shifted, and the masks are LiBai's formulas -- and the tokenizer built from
LiBai's t5_dataset.py keywords."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from libai_t5_data import SPECIAL, build_t5_corpus

from libai.data.datasets import LiBaiT5Dataset, T5Dataset
from libai.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    vocab, prefix = build_t5_corpus(tmp_path_factory.mktemp("t5_libai"))
    tokenizer = BertTokenizer(vocab, do_lower_case=True, do_chinese_wwm=True, **SPECIAL)
    return tokenizer, prefix


def test_tokenizer_appends_libais_special_tokens_in_its_order(corpus):
    """[BOS], [EOS] and <extra_id_0..99> are not in vocab.txt: appended after its 120 ids
    in that order (LiBai's T5 dataset adds them so), matched whole in text."""
    tokenizer, _ = corpus
    assert tokenizer.vocab_size == 120 + 102
    assert (tokenizer.bos, tokenizer.eos) == (120, 121)
    assert tokenizer.additional_special_tokens_ids == list(range(122, 222))
    assert tokenizer.encode("<extra_id_7> [EOS]") == [129, 121]


def test_samples_rebuild_the_corpus_with_whole_word_spans(corpus):
    tokenizer, prefix = corpus
    ds = T5Dataset(
        name="t5",
        tokenizer=tokenizer,
        data_prefix=prefix,
        max_seq_length=32,
        max_seq_length_dec=16,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        seed=1234,
    )
    assert isinstance(ds, LiBaiT5Dataset)
    assert type(T5Dataset(tokenizer=tokenizer, data_prefix=prefix, max_seq_length=32)) is T5Dataset
    vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    sentinels = tokenizer.additional_special_tokens_ids
    spans_seen = 0
    for idx in range(0, len(ds), 7):
        s = ds[idx]
        first, last, target = (int(x) for x in ds.samples_mapping[idx])
        text = np.concatenate([ds.indexed_dataset.get(i) for i in range(first, last)])[:target]
        enc = s["encoder_input_ids"][s["encoder_attn_mask"][0]].tolist()
        n_dec = int(s["loss_mask"].sum())
        labels = s["lm_labels"][:n_dec].tolist()
        dec_in = s["decoder_input_ids"][:n_dec].tolist()
        assert dec_in == [tokenizer.bos] + labels[:-1] and labels[-1] == tokenizer.eos
        assert (s["lm_labels"][n_dec:] == -100).all()
        # labels: <X0> span0 <X1> span1 ... [EOS], sentinels numbered from 0
        cuts = [i for i, t in enumerate(labels) if t in sentinels]
        assert [labels[i] for i in cuts] == sentinels[: len(cuts)] and cuts[:1] in ([], [0])
        spans = [labels[a + 1 : b] for a, b in zip(cuts, cuts[1:] + [n_dec - 1])]
        rebuilt, masked = [], 0
        for t in enc:
            if t in sentinels:
                span = spans[sentinels.index(t)]
                assert span and not vocab[span[0]].startswith("##")  # starts a word
                rebuilt += span
                masked += len(span)
                after = len(rebuilt)
                if after < len(text):  # ends a word: the next token is no ## piece
                    assert not vocab[int(text[after])].startswith("##")
            else:
                rebuilt.append(t)
        assert rebuilt == text.tolist()
        # LiBai's budget: min(prob * target, max(1, round(len * prob))) tokens (none when a
        # short run's prob * target < 1)
        budget = min(0.15 * target, max(1, round(len(text) * 0.15)))
        assert min(1, int(budget)) <= masked <= budget
        spans_seen += len(spans)
        # LiBai's masks: padding both sides, causal decoder
        real_e = torch.arange(32) < len(enc)
        real_d = torch.arange(16) < n_dec
        assert torch.equal(s["encoder_attn_mask"], real_e[:, None] & real_e[None])
        causal = torch.ones(16, 16, dtype=torch.bool).tril()
        assert torch.equal(s["decoder_attn_mask"], real_d[:, None] & real_d[None] & causal)
        assert torch.equal(s["encoder_decoder_attn_mask"], real_d[:, None] & real_e[None])
    assert spans_seen > len(range(0, len(ds), 7))  # several spans per sample somewhere
