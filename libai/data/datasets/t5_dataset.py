"""T5 pretraining samples: span corruption (Raffel et al., 2020; Hugging Face's T5 MLM recipe).

The documents of the split (sentences of a document concatenated) are shuffled and laid
end to end, as for GPT, and cut into chunks of ``tokens_length`` tokens: the longest chunk
whose corrupted encoder input, ``</s>`` included, fits in ``max_seq_length`` (see
:func:`t5_input_target_lengths`). In each chunk ``noise_density`` of the tokens, in about
``length * noise_density / mean_noise_span_length`` spans, are noise
(:func:`random_spans_noise_mask`; the chunk starts with kept text and ends with a noise
span). Span ``k`` is replaced by sentinel ``k`` (``<extra_id_k>``) in the encoder input, and
the targets list each sentinel followed by the tokens it hides::

    tokens  : a  b c  d e  f g           (noise spans: "b c" and "f g")
    encoder : a <X0> d e <X1> </s>
    labels  : <X0> b c <X1> f g </s>

The decoder input is the labels shifted right behind the decoder start token (the pad id,
as in T5). Chunks cross document boundaries, so preprocess with ``--append-eod`` to keep an
end-of-document token between documents.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from libai.config.configurable import init_signature
from libai.data.datasets.gpt_dataset import build_index_mappings
from libai.data.datasets.lm_utils import (
    IGNORE_INDEX,
    IndexedDocumentDataset,
    document_token_sizes,
    pad_to,
    read_document,
    token_id,
)

_EXTRA_ID = re.compile(r"^<extra_id_(\d+)>$")


def noise_span_counts(
    length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """``(noise tokens, noise spans)`` of a ``length``-token chunk (Hugging Face's rounding)."""
    num_noise = int(np.round(length * noise_density))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = int(np.round(min(num_noise, length - num_noise) / mean_noise_span_length))
    return num_noise, max(num_spans, 1)


def t5_input_target_lengths(
    max_seq_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int, int]:
    """``(tokens_length, inputs_length, targets_length)`` for an encoder of ``max_seq_length``.

    ``tokens_length`` is the longest raw chunk whose encoder input (kept tokens + one sentinel
    per span + ``</s>``) has at most ``max_seq_length`` tokens; ``targets_length`` counts the
    noise tokens + one sentinel per span + ``</s>``.
    """

    def lengths(tokens: int) -> tuple[int, int]:
        noise, spans = noise_span_counts(tokens, noise_density, mean_noise_span_length)
        return tokens - noise + spans + 1, noise + spans + 1

    if lengths(2)[0] > max_seq_length:
        raise ValueError(f"max_seq_length={max_seq_length} is too short for span corruption.")
    tokens = 2
    while lengths(tokens + 1)[0] <= max_seq_length:
        tokens += 1
    return (tokens, *lengths(tokens))


def _random_segmentation(num_items: int, num_segments: int, rng) -> np.ndarray:
    """Lengths of a random split of ``num_items`` into ``num_segments`` non-empty parts."""
    first_in_segment = np.arange(num_items - 1) < (num_segments - 1)
    rng.shuffle(first_in_segment)
    segment_id = np.cumsum(np.concatenate([[False], first_in_segment]))
    return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(
    length: int,
    noise_density: float,
    mean_noise_span_length: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Boolean ``[length]`` noise mask: alternating kept / noise spans, kept first (T5's)."""
    num_noise, num_spans = noise_span_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    kept_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    interleaved = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)
    span_starts = np.zeros(length, dtype=np.int64)
    span_starts[np.cumsum(interleaved)[:-1]] = 1
    return np.cumsum(span_starts) % 2 == 1


def span_corrupt(tokens: np.ndarray, noise: np.ndarray, sentinels: np.ndarray, eos: int):
    """``(encoder_ids, target_ids)``: noise spans replaced by sentinels / listed after them."""
    tokens = np.asarray(tokens, dtype=np.int64)
    prev = np.concatenate([[False], noise[:-1]])
    starts = noise & ~prev
    span = np.cumsum(starts) - 1
    enc = np.where(starts, sentinels[np.maximum(span, 0)], tokens)[~noise | starts]
    kept_starts = ~noise & np.concatenate([[True], noise[:-1]])  # kept span k+1 follows noise k
    label_span = np.cumsum(kept_starts) - 1
    tgt = np.where(kept_starts, sentinels[np.maximum(label_span, 0)], tokens)[noise | kept_starts]
    # targets start with sentinel 0 (the kept span 0 marker) and, since the chunk ends with
    # noise, never end with a sentinel: <X0> noise_0 <X1> noise_1 ...
    return np.append(enc, eos), np.append(tgt, eos)


def resolve_sentinel_ids(tokenizer, sentinel_ids=None, owner: str = "T5Dataset") -> list | None:
    """The sentinel ids ``[<extra_id_0>, <extra_id_1>, ...]`` (``None`` when not found).

    In order of preference: ``sentinel_ids`` given to the dataset (a list, or a callable
    ``k -> id``); ``tokenizer.sentinel_ids`` or ``tokenizer.sentinel_token_ids`` (same
    forms; ``libai.tokenizer.T5Tokenizer`` has the latter); the ``<extra_id_k>`` entries of
    ``tokenizer.additional_special_tokens`` with ``additional_special_tokens_ids``, ordered
    by ``k``; ``tokenizer.additional_special_tokens_ids`` as listed.
    """
    sources = (
        sentinel_ids,
        getattr(tokenizer, "sentinel_ids", None),
        getattr(tokenizer, "sentinel_token_ids", None),
    )
    for source in sources:
        if source is not None:
            return source if callable(source) else [int(i) for i in source]
    ids = getattr(tokenizer, "additional_special_tokens_ids", None)
    if ids is None:
        return None
    ids = [int(i) for i in ids]
    tokens = getattr(tokenizer, "additional_special_tokens", None)
    if tokens is not None and len(tokens) == len(ids):
        numbered = [(_EXTRA_ID.match(str(t)), i) for t, i in zip(tokens, ids)]
        numbered = sorted((int(m.group(1)), i) for m, i in numbered if m)
        if numbered:
            if [k for k, _ in numbered] != list(range(len(numbered))):
                raise ValueError(f"{owner}: the tokenizer's <extra_id_k> tokens are not 0..n-1.")
            return [i for _, i in numbered]
    return ids


class T5Dataset(IndexedDocumentDataset):
    """Span-corruption samples over (a split of) an indexed dataset.

    Positional arguments as :class:`~libai.data.datasets.bert_dataset.BertDataset`'s;
    ``documents``, ``num_samples`` and ``sentinel_ids`` keyword-only.

    Args:
        name: name used in logs and errors.
        tokenizer: any object with the ids ``eos`` and ``pad`` and sentinel ids (see
            :func:`resolve_sentinel_ids`), e.g. ``libai.tokenizer.T5Tokenizer``.
        data_prefix: prefix of the ``.bin`` / ``.idx`` pair.
        indexed_dataset: the opened dataset; ``None`` opens ``data_prefix``.
        max_num_samples: samples to provide; ``None`` = one epoch.
        max_seq_length: encoder length (``encoder_input_ids`` is padded to it).
        max_seq_length_dec: decoder length; must hold the targets
            (:func:`t5_input_target_lengths` gives their length).
        noise_density: fraction of tokens corrupted.
        mean_noise_span_length: average corrupted span length.
        seed: seed of the document order and of every sample's spans.
        documents: document indices (rows of ``doc_idx``) of this split; ``None`` = all.
        num_samples: alias of ``max_num_samples``.
        sentinel_ids: overrides the tokenizer's sentinels (list or callable ``k -> id``).

    ``dataset[i]`` is a dict of ``torch.long`` tensors: ``encoder_input_ids`` and
    ``encoder_attn_mask`` (``[max_seq_length]``), ``decoder_input_ids``,
    ``decoder_attn_mask``, ``lm_labels`` (-100 at padding) and ``loss_mask``
    (``[max_seq_length_dec]``). The masks are 1 at tokens and 0 at padding; the decoder's
    causal mask is the model's job.

    Given LiBai's keywords ``masked_lm_prob`` / ``short_seq_prob`` (LiBai's
    ``configs/common/data/t5_dataset.py``), ``T5Dataset(...)`` builds LiBai's dataset
    instead, :class:`~libai.data.datasets.t5_libai_dataset.LiBaiT5Dataset` (whole-word
    span masking, ``[BOS]``/``[EOS]``, extended masks), which LiBai's T5 model reads.
    """

    def __new__(cls, *args, **kwargs):
        if cls is T5Dataset and ("masked_lm_prob" in kwargs or "short_seq_prob" in kwargs):
            from libai.data.datasets.t5_libai_dataset import LiBaiT5Dataset  # imports this

            return LiBaiT5Dataset(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        name: str = "t5",
        tokenizer=None,
        data_prefix: str | None = None,
        indexed_dataset=None,
        max_num_samples: int | None = None,
        max_seq_length: int = 512,
        max_seq_length_dec: int = 128,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0,
        seed: int = 1234,
        *,
        documents=None,
        num_samples: int | None = None,
        sentinel_ids=None,
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
        if not 0.0 < float(noise_density) < 1.0:
            raise ValueError(f"{self.owner}: noise_density must be in (0, 1), got {noise_density}.")
        if float(mean_noise_span_length) < 1.0:
            raise ValueError(
                f"{self.owner}: mean_noise_span_length must be >= 1, got {mean_noise_span_length}."
            )
        self.max_seq_length = int(max_seq_length)
        self.max_seq_length_dec = int(max_seq_length_dec)
        self.noise_density = float(noise_density)
        self.mean_noise_span_length = float(mean_noise_span_length)
        self.tokens_length, self.inputs_length, self.targets_length = t5_input_target_lengths(
            self.max_seq_length, self.noise_density, self.mean_noise_span_length
        )
        if self.targets_length > self.max_seq_length_dec:
            raise ValueError(
                f"{self.owner}: max_seq_length_dec={self.max_seq_length_dec} cannot hold the "
                f"{self.targets_length} target tokens of max_seq_length={self.max_seq_length} "
                f"with noise_density={self.noise_density}; set max_seq_length_dec >= "
                f"{self.targets_length}."
            )
        self.eos_id = token_id(tokenizer, "eos", self.owner)
        self.pad_id = token_id(tokenizer, "pad", self.owner)
        self.num_spans = noise_span_counts(
            self.tokens_length, self.noise_density, self.mean_noise_span_length
        )[1]
        self._sentinel_arg = sentinel_ids
        sentinels = resolve_sentinel_ids(tokenizer, sentinel_ids, self.owner)
        if sentinels is None:
            raise ValueError(
                f"{self.owner}: no sentinel ids; give sentinel_ids=..., or a tokenizer with "
                "`sentinel_ids` or `additional_special_tokens_ids` (<extra_id_0>, ...)."
            )
        if callable(sentinels):
            sentinels = [int(sentinels(k)) for k in range(self.num_spans)]
        if len(sentinels) < self.num_spans:
            raise ValueError(
                f"{self.owner}: a sample has {self.num_spans} noise spans but only "
                f"{len(sentinels)} sentinel ids are known; add extra ids to the tokenizer or "
                "lower max_seq_length / noise_density."
            )
        self.sentinel_ids = np.asarray(sentinels[: self.num_spans], dtype=np.int64)

    def _init_kwargs(self) -> dict:
        return dict(
            tokenizer=self.tokenizer,
            data_prefix=self.data_prefix,
            max_seq_length=self.max_seq_length,
            max_seq_length_dec=self.max_seq_length_dec,
            noise_density=self.noise_density,
            mean_noise_span_length=self.mean_noise_span_length,
            seed=self.seed,
            sentinel_ids=self._sentinel_arg,
        )

    def _build_mapping(self):
        doc_sizes = document_token_sizes(self.indexed_dataset)
        tokens = int(doc_sizes[self.documents].sum()) if len(self.documents) else 0
        if tokens <= self.tokens_length:
            raise ValueError(
                f"{self.owner}: its {len(self.documents)} documents hold {tokens} tokens, not "
                f"enough for one chunk of {self.tokens_length} + 1 tokens (max_seq_length="
                f"{self.max_seq_length}). Use more data or a smaller max_seq_length."
            )
        # GPT's index over document-level sizes; chunk i is tokens [i * L, (i + 1) * L).
        self._doc_order, self._sample_idx, shuffle_idx = build_index_mappings(
            name=self.name,
            documents=self.documents,
            sizes=doc_sizes,
            num_samples=self.max_num_samples,
            seq_length=self.tokens_length,
            seed=self.seed,
        )
        return shuffle_idx

    @property
    def doc_order(self) -> np.ndarray:
        """The split's documents, shuffled and repeated per epoch, in stream order."""
        return self._built("_doc_order")

    @property
    def sample_idx(self) -> np.ndarray:
        """``[n + 1, 2]`` (position in :attr:`doc_order`, token offset) of each chunk start."""
        return self._built("_sample_idx")

    def get_tokens(self, idx: int) -> np.ndarray:
        """The ``tokens_length`` uncorrupted token ids of sample ``idx``."""
        j = int(self.samples_mapping[idx])
        doc_f, off_f = (int(x) for x in self.sample_idx[j])
        doc_l, off_l = (int(x) for x in self.sample_idx[j + 1])
        ix = self.indexed_dataset
        if doc_f == doc_l:
            return read_document(ix, int(self.doc_order[doc_f]), off_f, off_l - off_f)
        parts = [read_document(ix, int(self.doc_order[doc_f]), off_f)]
        parts += [read_document(ix, int(self.doc_order[k])) for k in range(doc_f + 1, doc_l)]
        parts.append(read_document(ix, int(self.doc_order[doc_l]), 0, off_l))
        return np.concatenate(parts)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        tokens = self.get_tokens(idx)
        noise = random_spans_noise_mask(
            len(tokens), self.noise_density, self.mean_noise_span_length, self.sample_rng(idx)
        )
        enc, labels = span_corrupt(tokens, noise, self.sentinel_ids, self.eos_id)
        dec_in = np.concatenate([[self.pad_id], labels[:-1]])
        n_enc, n_dec = len(enc), len(labels)
        s_enc, s_dec = self.max_seq_length, self.max_seq_length_dec
        return {
            "encoder_input_ids": pad_to(enc, s_enc, self.pad_id),
            "decoder_input_ids": pad_to(dec_in, s_dec, self.pad_id),
            "encoder_attn_mask": pad_to(np.ones(n_enc, np.int64), s_enc, 0),
            "decoder_attn_mask": pad_to(np.ones(n_dec, np.int64), s_dec, 0),
            "lm_labels": pad_to(labels, s_dec, IGNORE_INDEX),
            "loss_mask": pad_to(np.ones(n_dec, np.int64), s_dec, 0),
        }


# ``inspect.signature(T5Dataset)`` (instantiate, config tools) shows ``__init__``'s
# parameters, not the dispatching ``__new__``'s ``*args, **kwargs``
T5Dataset.__signature__ = init_signature(T5Dataset)
