"""LiBai's ``masking_style`` for the BERT / RoBERTa datasets: whole-word n-gram masking.

Without ``masking_style`` the datasets mask single tokens (:func:`~libai.data.datasets.
lm_utils.mask_tokens`). With it, masking follows LiBai's (Megatron's)
``create_masked_lm_predictions``:

- **words**: a token whose string starts with ``##`` continues the word before it, so the
  pieces of a word are masked together (every byte-level BPE token is a word of its own);
- **spans**: words are visited in random order; each starts an n-gram of ``n`` in {1, 2, 3}
  whole words drawn with probability proportional to ``1/n`` (shortened when it would pass
  the budget, skipped when it overlaps a masked word), until
  ``min(mask_lm_prob * target_length, max(1, round(mask_lm_prob * len(tokens))))`` tokens
  are masked (``len(tokens)`` counts the special tokens, as LiBai);
- **replacement**, per masked token: ``"bert"``: ``[MASK]`` with probability 0.8, else
  unchanged or a uniformly random id (0.1 each); ``"t5"``: always ``[MASK]``;
  ``"bert-cn-wwm"``: as ``"bert"``, and every Chinese ``##X`` token of the input (the
  continuation pieces that ``BertTokenizer(do_chinese_wwm=True)`` writes) is shown to the model
  as ``X`` -- the labels keep the ``##X`` ids, as LiBai's.

The random draws come from each sample's own generator, so they are LiBai's distribution,
not its exact stream.
"""

from __future__ import annotations

import re

import numpy as np

from libai.data.datasets.lm_utils import IGNORE_INDEX

MASKING_STYLES = ("bert", "bert-cn-wwm", "t5")
_NGRAM_P = np.array([1.0, 1 / 2, 1 / 3]) / sum([1.0, 1 / 2, 1 / 3])
_CHINESE_CONTINUATION = re.compile("##[\u4e00-\u9fa5]")


class WholeWordMasking:
    """LiBai's masking for one ``masking_style`` over ``tokenizer``'s vocabulary (see the
    module doc). ``masker(tokens, candidates, target_length, prob, rng)`` returns
    ``(input_ids, labels)`` like :func:`~libai.data.datasets.lm_utils.mask_tokens`.

    Raises:
        ValueError: an unknown style, or a tokenizer without ``get_vocab()``.
    """

    def __init__(self, owner: str, style: str, tokenizer, mask_id: int, vocab_size: int):
        if style not in MASKING_STYLES:
            raise ValueError(
                f"{owner}: masking_style must be one of {list(MASKING_STYLES)} (LiBai's), "
                f"got {style!r}."
            )
        if not hasattr(tokenizer, "get_vocab"):
            raise ValueError(
                f"{owner}: masking_style={style!r} reads token strings (whole words are "
                "'##' pieces); give a tokenizer with get_vocab(), e.g. libai.tokenizer's."
            )
        self.style, self.mask_id, self.vocab_size = style, int(mask_id), int(vocab_size)
        vocab = tokenizer.get_vocab()
        size = max(self.vocab_size, max(vocab.values()) + 1)
        #: True for ids whose token continues the previous word
        self.continues = np.zeros(size, dtype=bool)
        #: the id the model sees for each id (``##X`` -> ``X`` under bert-cn-wwm)
        self.shown = np.arange(size, dtype=np.int64)
        for token, i in vocab.items():
            if token.startswith("##"):
                self.continues[i] = True
                if style == "bert-cn-wwm" and _CHINESE_CONTINUATION.match(token):
                    self.shown[i] = vocab.get(token[2:], i)

    def words(self, tokens: np.ndarray, candidates: np.ndarray) -> list[list[int]]:
        """Positions grouped into whole words (a non-candidate ends a word)."""
        words: list[list[int]] = []
        previous = -2
        for pos in np.flatnonzero(candidates).tolist():
            if words and previous == pos - 1 and self.continues[tokens[pos]]:
                words[-1].append(pos)
            else:
                words.append([pos])
            previous = pos
        return words

    def __call__(self, tokens, candidates, target_length: int, prob: float, rng):
        tokens = np.asarray(tokens, dtype=np.int64)
        labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
        out = self.shown[tokens] if self.style == "bert-cn-wwm" else tokens.copy()
        words = self.words(tokens, candidates)
        budget = min(prob * target_length, max(1, int(round(len(tokens) * prob))))
        covered: set[int] = set()
        starts = rng.permutation(len(words)).tolist()
        for start in starts:
            if len(covered) >= budget:
                break
            n = int(rng.choice(3, p=_NGRAM_P)) + 1
            span = [p for w in words[start : start + n] for p in w]
            while len(covered) + len(span) > budget and n > 1:
                n -= 1
                span = [p for w in words[start : start + n] for p in w]
            if len(covered) + len(span) > budget or covered.intersection(span):
                continue
            for pos in span:
                covered.add(pos)
                labels[pos] = tokens[pos]
                out[pos] = self._replacement(tokens[pos], rng)
        return out, labels

    def _replacement(self, token: int, rng) -> int:
        if self.style == "t5" or rng.random() < 0.8:
            return self.mask_id
        if rng.random() < 0.5:
            return int(self.shown[token])  # unchanged (as shown to the model)
        return int(rng.integers(0, self.vocab_size))
