"""Shared pieces of the BERT / RoBERTa / T5 pretraining datasets.

The three datasets read an indexed dataset whose *documents* are runs of *sentences*
(Megatron's BERT format): sequence ``i`` of the ``.bin`` is one sentence and document ``d``
is sequences ``[doc_idx[d], doc_idx[d + 1])``. ``tools/preprocess_data.py --split-sentences``
writes that layout; without it every document is a single "sentence".

Conventions shared with :class:`~libai.data.datasets.gpt_dataset.GPT2Dataset` (so the loader
builder treats all of them alike):

- positional arguments ``name, tokenizer, data_prefix, indexed_dataset, max_num_samples``,
  keyword-only ``documents`` and ``num_samples`` (an alias of ``max_num_samples``);
- ``documents`` are indices of *documents* (rows of ``doc_idx``), so
  :func:`libai.data.build.build_train_valid_test_datasets` splits these datasets by document
  (the class attribute ``split_by_document = True`` tells it to);
- the sample index is built on first use (``len()`` or ``[]``), from ``seed`` only;
- ``dataset[i]`` draws its random choices (masks, spans) from ``default_rng([seed, i])``, so
  a sample is the same in every process, worker and run; later epochs are new sample
  indices, so repeated text gets new masks.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from libai.data.data_utils.indexed_dataset import MMapIndexedDataset, get_indexed_dataset

logger = logging.getLogger(__name__)

#: label of the positions that carry no loss (``torch.nn.CrossEntropyLoss``'s default)
IGNORE_INDEX = -100

_SPLIT_HINT = (
    "Preprocess the corpus with `tools/preprocess_data.py --split-sentences` so that every "
    "document is stored as several sentences."
)


def token_id(tokenizer, attr: str, owner: str) -> int:
    """The special-token id ``tokenizer.<attr>``, with an error naming what is missing."""
    if tokenizer is None:
        raise ValueError(
            f"{owner} needs a tokenizer: any object with the token-id attributes it uses "
            f"(here `{attr}`), e.g. libai.tokenizer's tokenizers."
        )
    value = getattr(tokenizer, attr, None)
    if value is None:
        raise ValueError(
            f"{owner}: the tokenizer {type(tokenizer).__name__} has no `{attr}` token id "
            f"(tokenizer.{attr} is missing or None)."
        )
    return int(value)


def check_mask_lm_prob(owner: str, mask_lm_prob) -> float:
    """``mask_lm_prob`` as a float in (0, 1), or a ValueError naming ``owner``."""
    if not 0.0 < float(mask_lm_prob) < 1.0:
        raise ValueError(f"{owner}: mask_lm_prob must be in (0, 1), got {mask_lm_prob}.")
    return float(mask_lm_prob)


def set_masked_lm_token_ids(dataset, tokenizer) -> None:
    """``dataset.cls_id``, ``sep_id``, ``mask_id``, ``pad_id`` and ``vocab_size`` from
    ``tokenizer`` (see :func:`token_id`), for a masked-LM dataset."""
    for attr in ("cls", "sep", "mask", "pad"):
        setattr(dataset, f"{attr}_id", token_id(tokenizer, attr, dataset.owner))
    dataset.vocab_size = token_id(tokenizer, "vocab_size", dataset.owner)


def open_indexed(owner: str, data_prefix, indexed_dataset) -> MMapIndexedDataset:
    if indexed_dataset is not None:
        return indexed_dataset
    if data_prefix is None:
        raise ValueError(f"{owner} needs data_prefix or indexed_dataset.")
    return get_indexed_dataset(data_prefix)


def num_documents(indexed) -> int:
    """Documents in ``indexed`` (rows of ``doc_idx`` minus one)."""
    return max(len(indexed.doc_idx) - 1, 0)


def document_token_sizes(indexed) -> np.ndarray:
    """Tokens per document (``int64[num_documents]``): the sum of its sentences' sizes."""
    sizes = np.asarray(indexed.sizes, dtype=np.int64)
    csum = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=csum[1:])
    doc_idx = np.asarray(indexed.doc_idx, dtype=np.int64)
    return csum[doc_idx[1:]] - csum[doc_idx[:-1]]


def read_document(indexed, doc: int, offset: int = 0, length: int | None = None) -> np.ndarray:
    """Tokens ``[offset, offset + length)`` of document ``doc`` (its sentences concatenated)."""
    first, last = int(indexed.doc_idx[doc]), int(indexed.doc_idx[doc + 1])
    if last - first == 1:
        return indexed.get(first, offset=offset, length=length)
    tokens = np.concatenate(indexed[first:last]) if last > first else np.zeros(0, np.int64)
    end = len(tokens) if length is None else offset + length
    return tokens[offset:end]


def check_documents(owner: str, indexed, documents) -> np.ndarray:
    """``documents`` as ``int64`` document indices (all of them when ``None``), range-checked."""
    total = num_documents(indexed)
    if documents is None:
        return np.arange(total, dtype=np.int64)
    documents = np.asarray(documents, dtype=np.int64).reshape(-1)
    if len(documents) and (documents.min() < 0 or documents.max() >= total):
        raise ValueError(
            f"{owner}: document indices must be in [0, {total}) (the dataset has {total} "
            f"documents), got [{documents.min()}, {documents.max()}]."
        )
    return documents


def pad_to(values, length: int, pad_value: int) -> torch.Tensor:
    """A ``torch.long`` tensor of ``values`` right-padded with ``pad_value`` to ``length``."""
    out = np.full(length, pad_value, dtype=np.int64)
    out[: len(values)] = values
    return torch.from_numpy(out)


def mask_tokens(
    tokens: np.ndarray,
    candidates: np.ndarray,
    mask_prob: float,
    mask_id: int,
    vocab_size: int,
    rng: np.random.Generator,
    max_predictions: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked-LM corruption: ``(input_ids, labels)``.

    Among the ``candidates`` positions (real, non-special tokens), ``mask_prob`` of them are
    chosen (count rounded at random, so the expected rate is exact; at least one when there
    is a candidate; at most ``max_predictions``). A chosen token becomes ``mask_id`` with
    probability 0.8, a uniformly random id in ``[0, vocab_size)`` with 0.1, and stays as it
    is with 0.1. ``labels`` holds the original token at chosen positions and
    :data:`IGNORE_INDEX` elsewhere.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    positions = np.flatnonzero(candidates)
    labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
    if len(positions) == 0:
        return tokens.copy(), labels
    count = int(mask_prob * len(positions) + rng.random())
    count = max(count, 1)
    if max_predictions is not None:
        count = min(count, max(int(max_predictions), 1))
    count = min(count, len(positions))
    chosen = np.sort(rng.choice(positions, size=count, replace=False))
    labels[chosen] = tokens[chosen]
    out = tokens.copy()
    draw = rng.random(count)
    out[chosen[draw < 0.8]] = mask_id
    random_pos = chosen[draw >= 0.9]
    out[random_pos] = rng.integers(0, vocab_size, size=len(random_pos))
    return out, labels


def masked_lm_sample(
    tokens: np.ndarray,
    tokentypes: np.ndarray,
    candidates: np.ndarray,
    max_seq_length: int,
    pad_id: int,
    mask_id: int,
    vocab_size: int,
    mask_prob: float,
    rng: np.random.Generator,
    masker=None,
    target_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Mask ``tokens`` and pad everything to ``max_seq_length``: the BERT / RoBERTa sample.

    ``masker`` (a :class:`~libai.data.datasets.lm_masking.WholeWordMasking`, LiBai's
    ``masking_style``) replaces the single-token masking; ``target_length`` is the sample's
    target length, which bounds its number of predictions.
    """
    if masker is None:
        input_ids, labels = mask_tokens(tokens, candidates, mask_prob, mask_id, vocab_size, rng)
    else:
        length = len(tokens) if target_length is None else target_length
        input_ids, labels = masker(tokens, candidates, length, mask_prob, rng)
    return padded_masked_sample(input_ids, labels, tokentypes, max_seq_length, pad_id)


def padded_masked_sample(input_ids, labels, tokentypes, max_seq_length: int, pad_id: int) -> dict:
    """The masked-LM sample's tensors, padded to ``max_seq_length``."""
    n = len(input_ids)
    return {
        "input_ids": pad_to(input_ids, max_seq_length, pad_id),
        "attention_mask": pad_to(np.ones(n, np.int64), max_seq_length, 0),
        "tokentype_ids": pad_to(tokentypes, max_seq_length, 0),
        "lm_labels": pad_to(labels, max_seq_length, IGNORE_INDEX),
        "loss_mask": pad_to((labels != IGNORE_INDEX).astype(np.int64), max_seq_length, 0),
    }


class IndexedDocumentDataset(torch.utils.data.Dataset):
    """Base of the datasets over a document/sentence indexed dataset (see the module doc).

    Subclasses implement :meth:`_build_mapping` (the sample index, built lazily) and
    ``__getitem__``; :meth:`for_split` rebuilds the dataset for one train/valid/test split.
    """

    #: tells the loader builder to split these datasets by documents, not sequences
    split_by_document = True

    def __init__(
        self,
        name: str,
        tokenizer,
        data_prefix,
        indexed_dataset,
        max_num_samples: int | None,
        seed: int,
        documents,
        num_samples: int | None,
    ):
        owner = f"{type(self).__name__} {name!r}"
        if max_num_samples is not None and num_samples is not None:
            raise ValueError(f"{owner}: give max_num_samples or num_samples, not both.")
        if max_num_samples is None:
            max_num_samples = num_samples
        if max_num_samples is not None and int(max_num_samples) < 1:
            raise ValueError(f"{owner}: num_samples must be >= 1, got {max_num_samples}.")
        self.name = name
        self.owner = owner
        self.tokenizer = tokenizer
        self.data_prefix = data_prefix
        self.indexed_dataset = open_indexed(owner, data_prefix, indexed_dataset)
        self.max_num_samples = None if max_num_samples is None else int(max_num_samples)
        self.seed = int(seed)
        self.documents = check_documents(owner, self.indexed_dataset, documents)
        self._mapping = None

    # ---- the lazily built sample index ------------------------------------------------------
    def _build_mapping(self):
        raise NotImplementedError

    @property
    def samples_mapping(self):
        """The sample index (built on first access)."""
        if self._mapping is None:
            start = time.perf_counter()
            self._mapping = self._build_mapping()
            logger.info(
                "%s: %d documents, %d samples (index built in %.2fs)",
                self.owner,
                len(self.documents),
                len(self._mapping),
                time.perf_counter() - start,
            )
        return self._mapping

    def _built(self, attr: str):
        """``self.<attr>``, set by :meth:`_build_mapping` (builds the index first)."""
        _ = self.samples_mapping
        return getattr(self, attr)

    def __len__(self) -> int:
        return len(self.samples_mapping)

    def sample_rng(self, idx: int) -> np.random.Generator:
        """The random generator of sample ``idx`` (same in every process and run)."""
        return np.random.default_rng([self.seed, int(idx)])

    def _init_kwargs(self) -> dict:
        """The constructor arguments that :meth:`for_split` keeps."""
        raise NotImplementedError

    def for_split(self, name: str, indexed_dataset, documents, max_num_samples):
        """The same dataset over ``documents`` with ``max_num_samples`` samples (loader builder)."""
        kwargs = self._init_kwargs()
        kwargs.update(
            name=name,
            indexed_dataset=indexed_dataset,
            documents=documents,
            max_num_samples=max_num_samples,
        )
        return type(self)(**kwargs)


def sentence_bounds(indexed, documents: np.ndarray) -> tuple[list[int], list[int]]:
    """First and one-past-last sentence of each document, as Python lists (fast loops)."""
    doc_idx = np.asarray(indexed.doc_idx, dtype=np.int64)
    return doc_idx[documents].tolist(), doc_idx[documents + 1].tolist()


def epochs_until(owner: str, build_epoch, num_samples: int | None) -> np.ndarray:
    """Concatenate ``build_epoch(epoch)`` (each already shuffled) until ``num_samples`` rows.

    ``None`` = one epoch. The result is cut to exactly ``num_samples`` rows.
    """
    epochs, total, epoch = [], 0, 0
    while True:
        rows = build_epoch(epoch)
        if len(rows) == 0:
            raise ValueError(
                f"{owner}: its documents give no sample. Use more data, or check that the "
                f"documents have enough sentences. {_SPLIT_HINT}"
            )
        epochs.append(rows)
        total += len(rows)
        epoch += 1
        if num_samples is None or total >= num_samples:
            break
    mapping = np.concatenate(epochs)
    return mapping if num_samples is None else mapping[:num_samples]
