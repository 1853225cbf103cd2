"""BERT pretraining samples: masked LM + next-sentence prediction (Megatron-LM / LiBai style).

Documents are runs of sentences (see :mod:`libai.data.datasets.lm_utils`). The sample index
follows Megatron's ``helpers.build_mapping``: each epoch walks the documents in order and
cuts each one into runs of whole sentences of about a target length (``max_seq_length - 3``
tokens, or with probability ``short_seq_prob`` a random length in ``[2, max_seq_length - 3]``);
with ``binary_head`` a run has at least two sentences and documents with fewer are skipped.
Each epoch's runs are shuffled; epochs are added until ``num_samples`` runs exist.

A run becomes ``[CLS] A [SEP] B [SEP]``: A is its first ``k`` sentences (``k`` random), B the
rest. With probability 0.5 A and B are swapped and ``ns_labels = 1`` ("B is not the text
that follows A", Megatron's negative), otherwise ``ns_labels = 0`` (B continues A), as in
Hugging Face's ``next_sentence_label``. The pair is trimmed to the run's target length by
dropping tokens at random ends of the longer segment; then ``mask_lm_prob`` of the real tokens
are masked (80% ``[MASK]``, 10% random token, 10% unchanged).
"""

from __future__ import annotations

import numpy as np
import torch

from libai.data.datasets.lm_masking import WholeWordMasking
from libai.data.datasets.lm_utils import (
    IndexedDocumentDataset,
    check_mask_lm_prob,
    epochs_until,
    masked_lm_sample,
    sentence_bounds,
    set_masked_lm_token_ids,
)


class BertDataset(IndexedDocumentDataset):
    """Masked-LM (+ next-sentence) samples over (a split of) a sentence-indexed dataset.

    Positional arguments in LiBai's order; ``documents`` and ``num_samples`` keyword-only.

    Args:
        name: name used in logs and errors (the loader builder appends ``/train`` etc.).
        tokenizer: any object with the ids ``cls``, ``sep``, ``mask``, ``pad`` and
            ``vocab_size`` (e.g. ``libai.tokenizer.BertTokenizer``).
        data_prefix: prefix of the ``.bin`` / ``.idx`` pair.
        indexed_dataset: the opened dataset; ``None`` opens ``data_prefix``.
        max_num_samples: samples to provide (more than one epoch cuts the documents again
            with new random lengths). ``None`` = one epoch.
        max_seq_length: length of every sample (padded).
        mask_lm_prob: fraction of real tokens to predict.
        short_seq_prob: probability of a run with a random shorter target length.
        seed: seed of the index and of every sample's random choices.
        binary_head: build sentence pairs and ``ns_labels``; ``False`` = one segment
            ``[CLS] text [SEP]``, no ``ns_labels`` key.
        masking_style: LiBai's ``"bert"``, ``"bert-cn-wwm"`` or ``"t5"``: whole-word n-gram
            masking (:mod:`libai.data.datasets.lm_masking`); ``None`` = single tokens.
        documents: document indices (rows of ``doc_idx``) of this split; ``None`` = all.
        num_samples: alias of ``max_num_samples``.

    ``dataset[i]`` is a dict of ``torch.long`` tensors: ``input_ids``, ``attention_mask``
    (1 = token, 0 = padding), ``tokentype_ids`` (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``),
    ``lm_labels`` (the original token at masked positions, -100 elsewhere), ``loss_mask``
    (1 at masked positions), all ``[max_seq_length]``, and ``ns_labels`` (``[]``) when
    ``binary_head``.
    """

    def __init__(
        self,
        name: str = "bert",
        tokenizer=None,
        data_prefix: str | None = None,
        indexed_dataset=None,
        max_num_samples: int | None = None,
        max_seq_length: int = 512,
        mask_lm_prob: float = 0.15,
        short_seq_prob: float = 0.1,
        seed: int = 1234,
        binary_head: bool = True,
        masking_style: str | None = None,
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
            seed,
            documents,
            num_samples,
        )
        self.binary_head = bool(binary_head)
        special = 3 if self.binary_head else 2
        if int(max_seq_length) < special + 2:
            raise ValueError(
                f"{self.owner}: max_seq_length must be >= {special + 2} ({special} special "
                f"tokens + 2), got {max_seq_length}."
            )
        mask_lm_prob = check_mask_lm_prob(self.owner, mask_lm_prob)
        if not 0.0 <= float(short_seq_prob) <= 1.0:
            raise ValueError(
                f"{self.owner}: short_seq_prob must be in [0, 1], got {short_seq_prob}."
            )
        self.max_seq_length = int(max_seq_length)
        self.max_num_tokens = self.max_seq_length - special
        self.mask_lm_prob = float(mask_lm_prob)
        self.short_seq_prob = float(short_seq_prob)
        set_masked_lm_token_ids(self, tokenizer)
        self.masking_style = masking_style
        self.masker = None
        if masking_style is not None:
            self.masker = WholeWordMasking(
                self.owner, masking_style, tokenizer, self.mask_id, self.vocab_size
            )

    def _init_kwargs(self) -> dict:
        return dict(
            tokenizer=self.tokenizer,
            data_prefix=self.data_prefix,
            max_seq_length=self.max_seq_length,
            mask_lm_prob=self.mask_lm_prob,
            short_seq_prob=self.short_seq_prob,
            seed=self.seed,
            binary_head=self.binary_head,
            masking_style=self.masking_style,
        )

    def _build_mapping(self) -> np.ndarray:
        """``int64[n, 3]``: (first sentence, one past the last sentence, target length)."""
        firsts, lasts = sentence_bounds(self.indexed_dataset, self.documents)
        sizes = np.asarray(self.indexed_dataset.sizes).tolist()
        rng = np.random.default_rng(self.seed)
        min_sentences = 2 if self.binary_head else 1
        max_tokens, short_prob = self.max_num_tokens, self.short_seq_prob

        def target_length() -> int:
            if short_prob > 0 and rng.random() < short_prob:
                return int(rng.integers(2, max_tokens + 1))
            return max_tokens

        def build_epoch(_epoch: int) -> np.ndarray:
            rows = []
            for first, last in zip(firsts, lasts):
                if last - first < min_sentences:
                    continue
                start, tokens, count, target = first, 0, 0, target_length()
                for sent in range(first, last):
                    tokens += sizes[sent]
                    count += 1
                    remaining = last - sent - 1
                    full = tokens >= target and remaining > 1 and count >= min_sentences
                    if full or remaining == 0:
                        rows.append((start, sent + 1, target))
                        start, tokens, count, target = sent + 1, 0, 0, target_length()
            rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
            return rows[rng.permutation(len(rows))]

        return epochs_until(self.owner, build_epoch, self.max_num_samples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        first, last, target = (int(x) for x in self.samples_mapping[idx])
        sentences = [self.indexed_dataset.get(i) for i in range(first, last)]
        rng = self.sample_rng(idx)
        is_random = False
        if self.binary_head:
            split = int(rng.integers(1, len(sentences))) if len(sentences) >= 3 else 1
            a = np.concatenate(sentences[:split])
            b = np.concatenate(sentences[split:])
            is_random = bool(rng.random() < 0.5)
            if is_random:
                a, b = b, a
        else:
            a = np.concatenate(sentences)
            b = a[:0]
        a, b = truncate_pair(a, b, target, rng)
        tokens = [[self.cls_id], a, [self.sep_id]]
        tokentypes = np.zeros(len(a) + 2, dtype=np.int64)
        if self.binary_head:
            tokens += [b, [self.sep_id]]
            tokentypes = np.concatenate([tokentypes, np.ones(len(b) + 1, dtype=np.int64)])
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
        candidates = np.ones(len(tokens), dtype=bool)
        candidates[0] = False
        candidates[len(a) + 1] = False
        candidates[-1] = False
        sample = self.masked_sample(tokens, tokentypes, candidates, rng, target)
        if self.binary_head:
            sample["ns_labels"] = torch.tensor(int(is_random), dtype=torch.long)
        return sample

    def masked_sample(
        self, tokens, tokentypes, candidates, rng, target=None
    ) -> dict[str, torch.Tensor]:
        """Mask ``tokens`` at ``candidates`` and pad: BERT's token-by-token masking, or
        LiBai's ``masking_style`` (whose count of predictions follows the run's ``target``
        length)."""
        return masked_lm_sample(
            tokens,
            tokentypes,
            candidates,
            self.max_seq_length,
            self.pad_id,
            self.mask_id,
            self.vocab_size,
            self.mask_lm_prob,
            rng,
            self.masker,
            target,
        )


def truncated_lengths(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Lengths after Megatron's trimming: drop one token at a time from the longer segment
    (from B on ties) until ``len_a + len_b <= max_tokens``."""
    while len_a + len_b > max_tokens:
        excess = len_a + len_b - max_tokens
        if len_a > len_b:
            len_a -= min(excess, len_a - len_b)
        elif len_b > len_a:
            len_b -= min(excess, len_b - len_a)
        else:
            len_b -= (excess + 1) // 2
            len_a -= excess // 2
    return len_a, len_b


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator):
    """Trim A and B to ``max_tokens`` together, each dropped token from a random end."""
    new_a, new_b = truncated_lengths(len(a), len(b), max_tokens)
    out = []
    for seg, keep in ((a, new_a), (b, new_b)):
        drop = len(seg) - keep
        front = int(rng.binomial(drop, 0.5)) if drop else 0
        out.append(seg[front : front + keep])
    return out[0], out[1]
