"""FleetX's ``ErnieDataset`` and ``ErnieCollateData`` by name: ERNIE pretraining samples
(masked LM + sentence pair) from FleetX's ERNIE corpus under ``input_dir``.

FleetX's ERNIE corpus (``create_pretraining_data.py``) is ``<prefix>_ids.npy`` (all token
ids) + ``<prefix>_idx.npz`` with ``lens`` (tokens per *sentence*) and ``docs`` (the
sentence index where each document starts, Megatron's ``doc_idx``). FleetX splits the
documents with ``split`` (rounded, the rounding error taken from the last split, as its
``get_train_valid_test_split_``) and builds Megatron's BERT samples over the split:
:class:`~libai.data.datasets.bert_dataset.BertDataset` does that here (same sample shape
and masking rules, its own random draws; see the differences below).

Masking is FleetX's (Megatron's ``create_masked_lm_predictions``): whole words (a ``##``
piece joins the word before it) in n-grams of 1 .. ``max_ngrams`` words, n drawn with
probability proportional to 1 / n (reversed with ``favor_longer_ngram``), until
``round(masked_lm_prob x tokens)`` tokens are chosen (a span that would exceed it is
shortened, else skipped); each chosen token becomes [MASK] 80%, stays 10%, a random id 10%.
Differences from FleetX: the random draws are libai's (same rules, not FleetX's C++
``build_mapping`` nor its numpy stream), and FleetX's ``to_chinese_char`` (a ``##`` Chinese
character shown as its plain character in the input) is not applied.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from libai.data.datasets.bert_dataset import BertDataset
from libai.data.datasets.fleetx_gpt import FleetXTokenFile, find_fleetx_prefix
from libai.data.datasets.lm_utils import IGNORE_INDEX, padded_masked_sample

__all__ = [
    "ErnieCollateData",
    "ErnieDataset",
    "ErnieMaskedDataset",
    "ErnieSeqClsDataset",
    "FleetXSentenceFile",
    "fleetx_split_bounds",
    "whole_word_ngram_mask",
]

MODES = {"Train": 0, "Eval": 1, "Test": 2}


class FleetXSentenceFile(FleetXTokenFile):
    """FleetX's ERNIE corpus as a sentence-indexed dataset: ``sizes`` (tokens per sentence),
    ``doc_idx`` (first sentence of each document, then the total) and ``get(i)``."""

    def __init__(self, prefix: str):
        super().__init__(prefix)
        with np.load(prefix + "_idx.npz", allow_pickle=False) as index:
            if "docs" not in index:
                raise ValueError(
                    f"ErnieDataset: {prefix}_idx.npz has no 'docs' (document boundaries); "
                    "write the corpus with FleetX's ernie create_pretraining_data.py"
                )
            self.doc_idx = np.asarray(index["docs"], dtype=np.int64)
        if self.doc_idx[-1] != len(self.sizes):
            raise ValueError(
                f"ErnieDataset: {prefix}: docs ends at sentence {self.doc_idx[-1]} but lens "
                f"has {len(self.sizes)} sentences; the files are not one corpus"
            )


def fleetx_split_bounds(split: Sequence[float], size: int) -> list[int]:
    """FleetX's ``get_train_valid_test_split_``: document boundaries ``[0, a, b, size]`` of
    the Train / Eval / Test splits for weights ``split``."""
    weights = [float(s) for s in split][:3]
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    if total <= 0:
        raise ValueError(f"Data.*.dataset.split must have a positive sum, got {list(split)}")
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(size))))
    diff = bounds[-1] - size
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def ErnieDataset(  # noqa: N802 - FleetX's name for what a YAML config builds
    input_dir: str,
    tokenizer_type: str | None = None,
    split: Sequence[float] = (949, 50, 1),
    mode: str = "Train",
    max_seq_length: int = 512,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    seed: int = 1234,
    binary_head: bool = True,
    share_folder: bool = False,
    favor_longer_ngram: bool = False,
    max_ngrams: int = 3,
    num_samples: int | None = None,
    tokenizer=None,
) -> BertDataset:
    """The ``mode`` split of FleetX's ERNIE corpus in ``input_dir`` as BERT samples
    (``{"input_ids", "attention_mask", "tokentype_ids", "lm_labels", "loss_mask"}`` and
    ``ns_labels`` with ``binary_head``). ``num_samples`` (filled by the Engine from the
    Global sizes and steps) = one epoch when unset. ``share_folder`` (where FleetX writes
    its index cache) has no effect: the index is built in memory. ``tokenizer`` (with the
    ids ``cls``, ``sep``, ``mask``, ``pad`` and ``vocab_size``) is the one ``ErnieModule``
    builds from ``tokenizer_type`` (the Engine passes it).
    """
    if mode not in MODES:
        raise ValueError(f"ErnieDataset mode must be one of {list(MODES)}, got {mode!r}")
    if tokenizer is None:
        raise ValueError(
            f"ErnieDataset needs a tokenizer: run it with Model.module: ErnieModule (which "
            f"builds one from Data.{mode}.dataset.tokenizer_type={tokenizer_type!r}) or pass "
            "tokenizer="
        )
    corpus = FleetXSentenceFile(find_fleetx_prefix(str(input_dir)))
    bounds = fleetx_split_bounds(split, len(corpus.doc_idx) - 1)
    start, end = bounds[MODES[mode]], bounds[MODES[mode] + 1]
    if end <= start:
        raise ValueError(
            f"ErnieDataset: the {mode} split {list(split)} of {input_dir} has no documents "
            f"({len(corpus.doc_idx) - 1} in all); change Data.{mode}.dataset.split"
        )
    return ErnieMaskedDataset(
        f"ernie/{mode}",
        tokenizer,
        indexed_dataset=corpus,
        max_seq_length=max_seq_length,
        mask_lm_prob=masked_lm_prob,
        short_seq_prob=short_seq_prob,
        seed=seed,
        binary_head=binary_head,
        documents=np.arange(start, end),
        num_samples=num_samples,
        max_ngrams=max_ngrams,
        favor_longer_ngram=favor_longer_ngram,
    )


def whole_word_ngram_mask(
    tokens: np.ndarray,
    candidates: np.ndarray,
    continuation: np.ndarray,
    mask_prob: float,
    max_ngrams: int,
    favor_longer_ngram: bool,
    mask_id: int,
    vocab_size: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """FleetX's whole-word n-gram masking (see the module doc): ``(input_ids, labels)``;
    ``continuation[id]`` is True for ``##`` pieces."""
    words: list[list[int]] = []
    for i in np.flatnonzero(candidates).tolist():
        if words and words[-1][-1] == i - 1 and continuation[tokens[i]]:
            words[-1].append(i)
        else:
            words.append([i])
    labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
    out = np.asarray(tokens, dtype=np.int64).copy()
    budget = max(1, int(round(len(tokens) * mask_prob)))
    pvals = 1.0 / np.arange(1, max_ngrams + 1)
    pvals = pvals[::-1] if favor_longer_ngram else pvals
    chosen: list[int] = []
    covered: set[int] = set()
    for w in rng.permutation(len(words)).tolist():
        if len(chosen) >= budget:
            break
        longest = min(max_ngrams, len(words) - w)
        p = pvals[:longest] / pvals[:longest].sum()
        n = int(rng.choice(np.arange(1, longest + 1), p=p))
        span = [i for word in words[w : w + n] for i in word]
        while len(chosen) + len(span) > budget and n > 1:  # shorter n-grams fit better
            n -= 1
            span = [i for word in words[w : w + n] for i in word]
        if len(chosen) + len(span) > budget or covered.intersection(span):
            continue
        covered.update(span)
        chosen.extend(span)
    chosen_at = np.asarray(sorted(chosen), dtype=np.int64)
    labels[chosen_at] = out[chosen_at]
    draw = rng.random(len(chosen_at))
    out[chosen_at[draw < 0.8]] = mask_id
    random_at = chosen_at[draw >= 0.9]
    out[random_at] = rng.integers(0, vocab_size, size=len(random_at))
    return out, labels


class ErnieMaskedDataset(BertDataset):
    """:class:`BertDataset` with FleetX's whole-word n-gram masking."""

    def __init__(self, *args, max_ngrams: int = 3, favor_longer_ngram: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if int(max_ngrams) < 1:
            raise ValueError(f"ErnieDataset max_ngrams must be >= 1, got {max_ngrams}")
        self.max_ngrams = int(max_ngrams)
        self.favor_longer_ngram = bool(favor_longer_ngram)
        vocab = self.tokenizer.get_vocab()
        self.continuation = np.zeros(max(max(vocab.values()) + 1, self.vocab_size), dtype=bool)
        for token, index in vocab.items():
            self.continuation[index] = token.startswith("##")

    def _init_kwargs(self) -> dict:
        return {
            **super()._init_kwargs(),
            "max_ngrams": self.max_ngrams,
            "favor_longer_ngram": self.favor_longer_ngram,
        }

    def masked_sample(
        self, tokens, tokentypes, candidates, rng, target=None
    ) -> dict[str, torch.Tensor]:
        input_ids, labels = whole_word_ngram_mask(
            tokens,
            candidates,
            self.continuation,
            self.mask_lm_prob,
            self.max_ngrams,
            self.favor_longer_ngram,
            self.mask_id,
            self.vocab_size,
            rng,
        )
        return padded_masked_sample(input_ids, labels, tokentypes, self.max_seq_length, self.pad_id)


class ErnieCollateData:
    """FleetX's ERNIE collate by name: stacks the samples into one batch of ``[batch, seq]``
    tensors (``ns_labels``: ``[batch]``). ``micro_batch_size`` is accepted: the Engine cuts
    micro-batches itself."""

    def __init__(self, micro_batch_size: int | None = None):
        self.micro_batch_size = micro_batch_size

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def ErnieSeqClsDataset(dataset_type=None, **kwargs):  # noqa: N802 - FleetX's name
    """FleetX's fine-tuning data set downloads PaddleNLP data sets by name; not here."""
    raise ValueError(
        f"Data.*.dataset.name: ErnieSeqClsDataset (dataset_type={dataset_type!r}) downloads "
        "PaddleNLP's data sets by name, which this library does not; use "
        "Data.*.dataset.name: TextClassificationDataset with data_path (a local CSV / TSV / "
        "JSON lines file) and ErnieSeqClsModule"
    )
