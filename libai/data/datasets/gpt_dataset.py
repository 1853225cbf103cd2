"""GPT pretraining samples cut from an indexed dataset (Megatron-LM / LiBai style).

Three index arrays, built with numpy from ``seed`` (no C++ helpers, no cache files: every
rank computes the same arrays in well under a second for millions of samples):

- ``doc_idx``: the documents of this split repeated for as many epochs as the requested
  number of samples needs, shuffled.
- ``sample_idx[i] = (k, offset)``: sample ``i`` starts at token ``offset`` of document
  ``doc_idx[k]``. Samples are ``max_seq_length + 1`` tokens of the concatenated documents, so
  they span document boundaries, and consecutive samples share one token (the last label of
  one sample is the first input of the next).
- ``shuffle_idx``: the order in which samples are served.

``dataset[i]`` is ``{"input_ids": tokens[:-1], "labels": tokens[1:]}`` (``torch.long``,
``max_seq_length`` each): labels are already shifted, as the GPT model expects.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from libai.data.data_utils.indexed_dataset import MMapIndexedDataset, get_indexed_dataset

logger = logging.getLogger(__name__)


class GPT2Dataset(torch.utils.data.Dataset):
    """Fixed-length language-model samples over (a split of) an indexed dataset.

    Positional arguments in LiBai's order; ``documents`` and ``num_samples`` are keyword-only.

    Args:
        name: name used in logs and errors (the loader builder appends ``/train`` etc.).
        tokenizer: unused, accepted so LiBai configs and trainers that pass it keep working.
        data_prefix: prefix of the ``.bin`` / ``.idx`` pair.
        indexed_dataset: the opened dataset; ``None`` opens ``data_prefix``.
        max_num_samples: samples to provide; more than one epoch repeats the documents in a
            new shuffled order. ``None`` = one epoch.
        max_seq_length: tokens per sample (inputs and labels are each this long).
        seed: seed of the document and sample shuffles.
        documents: indices of the sequences (documents) of this split; ``None`` = all.
        num_samples: alias of ``max_num_samples``.
    """

    def __init__(
        self,
        name: str = "gpt-2",
        tokenizer=None,
        data_prefix: str | None = None,
        indexed_dataset: MMapIndexedDataset | None = None,
        max_num_samples: int | None = None,
        max_seq_length: int = 1024,
        seed: int = 1234,
        *,
        documents=None,
        num_samples: int | None = None,
    ):
        if max_num_samples is not None and num_samples is not None:
            raise ValueError("GPT2Dataset: give max_num_samples or num_samples, not both.")
        if max_num_samples is None:
            max_num_samples = num_samples
        if indexed_dataset is None:
            if data_prefix is None:
                raise ValueError("GPT2Dataset needs data_prefix or indexed_dataset.")
            indexed_dataset = get_indexed_dataset(data_prefix)
        if int(max_seq_length) < 1:
            raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}.")
        self.name = name
        self.data_prefix = data_prefix
        self.tokenizer = tokenizer
        self.indexed_dataset = indexed_dataset
        self.max_seq_length = int(max_seq_length)
        self.seed = int(seed)
        if documents is None:
            documents = np.arange(len(indexed_dataset), dtype=np.int64)
        self.documents = np.asarray(documents, dtype=np.int64)

        start = time.perf_counter()
        self.doc_idx, self.sample_idx, self.shuffle_idx = build_index_mappings(
            name=name,
            documents=self.documents,
            sizes=indexed_dataset.sizes,
            num_samples=max_num_samples,
            seq_length=self.max_seq_length,
            seed=self.seed,
        )
        logger.info(
            "GPT2Dataset %s: %d documents, %d samples of %d tokens (index built in %.2fs)",
            name,
            len(self.documents),
            len(self),
            self.max_seq_length,
            time.perf_counter() - start,
        )

    def __len__(self) -> int:
        # sample i spans [sample_idx[i], sample_idx[i + 1]]
        return len(self.shuffle_idx)

    def get_tokens(self, idx: int) -> np.ndarray:
        """The ``max_seq_length + 1`` token ids of (shuffled) sample ``idx``."""
        idx = int(self.shuffle_idx[idx])
        doc_f, offset_f = (int(x) for x in self.sample_idx[idx])
        doc_l, offset_l = (int(x) for x in self.sample_idx[idx + 1])
        get = self.indexed_dataset.get
        if doc_f == doc_l:
            return get(int(self.doc_idx[doc_f]), offset=offset_f, length=offset_l - offset_f + 1)
        parts = [get(int(self.doc_idx[doc_f]), offset=offset_f)]
        parts.extend(get(int(self.doc_idx[k])) for k in range(doc_f + 1, doc_l))
        parts.append(get(int(self.doc_idx[doc_l]), length=offset_l + 1))
        return np.concatenate(parts)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(self.get_tokens(idx).astype(np.int64))
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}


def build_index_mappings(
    name: str,
    documents: np.ndarray,
    sizes: np.ndarray,
    num_samples: int | None,
    seq_length: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(doc_idx, sample_idx, shuffle_idx)`` for ``num_samples`` samples (Megatron's rules)."""
    documents = np.asarray(documents, dtype=np.int64)
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64)) if len(documents) else 0
    samples_per_epoch = max(tokens_per_epoch - 1, 0) // seq_length
    if tokens_per_epoch == 0 or (num_samples is None and samples_per_epoch == 0):
        raise ValueError(
            f"GPT2Dataset {name!r}: its {len(documents)} documents hold {tokens_per_epoch} tokens, "
            f"not enough for one sample of max_seq_length + 1 = {seq_length + 1} tokens. Use more "
            "data, a smaller max_seq_length, or give this split a larger share of the documents "
            "(splits)."
        )
    if num_samples is None:
        num_samples = samples_per_epoch
    num_samples = int(num_samples)
    if num_samples < 1:
        raise ValueError(f"GPT2Dataset {name!r}: num_samples must be >= 1, got {num_samples}.")
    num_epochs = _num_epochs(tokens_per_epoch, seq_length, num_samples)
    rng = np.random.RandomState(seed=seed)

    # With more than one epoch, a last epoch that contributes < 80% of its samples is shuffled
    # separately so its few samples don't all come from the same few documents.
    separate_last_epoch = False
    if num_epochs > 1:
        from_epochs_minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_samples = num_samples - from_epochs_minus_one
        separate_last_epoch = last_epoch_samples < int(0.80 * samples_per_epoch)

    doc_idx = _build_doc_idx(documents, num_epochs, rng, separate_last_epoch)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    total = len(sample_idx) - 1
    if separate_last_epoch:
        first = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
    else:
        first = total
    shuffle_idx = _build_shuffle_idx(first, total, rng)
    # Serve exactly num_samples samples (the index may hold a few more from the last epoch).
    return doc_idx, sample_idx, shuffle_idx[:num_samples]


def _num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Epochs needed for ``num_samples`` samples (the ``-1``: samples overlap by one token)."""
    num_epochs = 1
    while (num_epochs * tokens_per_epoch - 1) // seq_length < num_samples:
        num_epochs += 1
    return num_epochs


def _build_doc_idx(documents, num_epochs: int, rng, separate_last_epoch: bool) -> np.ndarray:
    """The documents repeated ``num_epochs`` times, shuffled (the last epoch apart if asked)."""
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.tile(np.asarray(documents, dtype=np.int64), num_epochs)
        rng.shuffle(doc_idx)
        return doc_idx
    first = _build_doc_idx(documents, num_epochs - 1, rng, False)
    last = _build_doc_idx(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_idx(
    sizes: np.ndarray,
    doc_idx: np.ndarray,
    seq_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
) -> np.ndarray:
    """``int64[num_samples + 1, 2]``: (position in ``doc_idx``, token offset) of each boundary.

    Sample ``i`` covers global tokens ``[i * seq_length, (i + 1) * seq_length]`` of the
    documents concatenated in ``doc_idx`` order; boundary ``i`` is the document holding
    token ``i * seq_length`` and the offset of that token in it. Vectorized equivalent of
    Megatron's ``helpers.build_sample_idx`` (same output).
    """
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    doc_sizes = np.asarray(sizes, dtype=np.int64)[doc_idx]
    starts = np.zeros(len(doc_sizes) + 1, dtype=np.int64)
    np.cumsum(doc_sizes, out=starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    # The document containing each position; side="right" skips empty documents.
    doc = np.searchsorted(starts, positions, side="right") - 1
    sample_idx = np.empty((num_samples + 1, 2), dtype=np.int64)
    sample_idx[:, 0] = doc
    sample_idx[:, 1] = positions - starts[doc]
    sample_idx[0] = (0, 0)
    return sample_idx


def _build_shuffle_idx(num_samples: int, total_size: int, rng) -> np.ndarray:
    """``[0, num_samples)`` shuffled, followed by ``[num_samples, total_size)`` shuffled."""
    first = np.arange(num_samples, dtype=np.int64)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=np.int64)
    rng.shuffle(last)
    return np.concatenate((first, last))
