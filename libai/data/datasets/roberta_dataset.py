"""RoBERTa pretraining samples: masked LM over full-sentence packing, no next-sentence task.

RoBERTa's FULL-SENTENCES inputs (Liu et al., 2019, section 4.2): every sample is a run of
whole, consecutive sentences of the corpus, as many as fit, and may cross document
boundaries. Each epoch shuffles the document order, lays the documents' sentences end to
end and packs them greedily; a sample reads::

    <s> sentences of document d </s> sentences of document d' </s> ...

(``</s>`` closes the text of each document in the sample.) A single sentence longer than a
sample is cut to fit. Epochs are added until ``num_samples`` samples exist, and each epoch's
samples are shuffled. Masking is BERT's (80/10/10) and drawn per sample index from ``seed``;
the same text met again in a later epoch is a new sample index, so it gets a new mask.
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


class RobertaDataset(IndexedDocumentDataset):
    """Masked-LM samples of packed full sentences over (a split of) an indexed dataset.

    Positional arguments as :class:`~libai.data.datasets.bert_dataset.BertDataset`'s;
    ``documents`` and ``num_samples`` keyword-only.

    Args:
        name: name used in logs and errors.
        tokenizer: any object with the ids ``cls`` (``<s>``), ``sep`` (``</s>``), ``pad``,
            ``mask`` and ``vocab_size`` (e.g. ``libai.tokenizer.RobertaTokenizer``).
        data_prefix: prefix of the ``.bin`` / ``.idx`` pair.
        indexed_dataset: the opened dataset; ``None`` opens ``data_prefix``.
        max_num_samples: samples to provide; ``None`` = one epoch.
        max_seq_length: length of every sample (padded).
        mask_lm_prob: fraction of real tokens to predict.
        seed: seed of the packing order and of every sample's mask.
        short_seq_prob: probability that a sample is packed to a random shorter length in
            ``[2, max_seq_length - 1]`` tokens (LiBai's option; 0 = always full).
        masking_style: LiBai's ``"bert"``, ``"bert-cn-wwm"`` or ``"t5"``: whole-word n-gram
            masking (:mod:`libai.data.datasets.lm_masking`); ``None`` = single tokens.
        documents: document indices (rows of ``doc_idx``) of this split; ``None`` = all.
        num_samples: alias of ``max_num_samples``.

    ``dataset[i]`` is a dict of ``torch.long`` tensors of shape ``[max_seq_length]``:
    ``input_ids``, ``attention_mask`` (1 = token, 0 = padding), ``tokentype_ids`` (zeros),
    ``lm_labels`` (original token at masked positions, -100 elsewhere), ``loss_mask``.
    """

    def __init__(
        self,
        name: str = "roberta",
        tokenizer=None,
        data_prefix: str | None = None,
        indexed_dataset=None,
        max_num_samples: int | None = None,
        max_seq_length: int = 512,
        mask_lm_prob: float = 0.15,
        seed: int = 1234,
        short_seq_prob: float = 0.0,
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
        if int(max_seq_length) < 3:
            raise ValueError(f"{self.owner}: max_seq_length must be >= 3, got {max_seq_length}.")
        mask_lm_prob = check_mask_lm_prob(self.owner, mask_lm_prob)
        self.max_seq_length = int(max_seq_length)
        self.mask_lm_prob = float(mask_lm_prob)
        if not 0.0 <= float(short_seq_prob) <= 1.0:
            raise ValueError(
                f"{self.owner}: short_seq_prob must be in [0, 1], got {short_seq_prob}."
            )
        self.short_seq_prob = float(short_seq_prob)
        set_masked_lm_token_ids(self, tokenizer)
        self.masking_style = masking_style
        self.masker = None
        if masking_style is not None:
            self.masker = WholeWordMasking(
                self.owner, masking_style, tokenizer, self.mask_id, self.vocab_size
            )
        self._stream = self._stream_new_doc = None

    def _init_kwargs(self) -> dict:
        return dict(
            tokenizer=self.tokenizer,
            data_prefix=self.data_prefix,
            max_seq_length=self.max_seq_length,
            mask_lm_prob=self.mask_lm_prob,
            seed=self.seed,
            short_seq_prob=self.short_seq_prob,
            masking_style=self.masking_style,
        )

    def _build_mapping(self) -> np.ndarray:
        """``int64[n, 2]``: sample ``i`` is ``stream[start:end]``."""
        bounds = sentence_bounds(self.indexed_dataset, self.documents)
        firsts, lasts = (np.asarray(x, dtype=np.int64) for x in bounds)
        sizes = np.asarray(self.indexed_dataset.sizes, dtype=np.int64)
        rng = np.random.default_rng(self.seed)
        budget = self.max_seq_length - 1  # <s> first; every document part costs one </s>
        short_prob = self.short_seq_prob

        def run_budget() -> int:
            if short_prob > 0 and rng.random() < short_prob:
                return int(rng.integers(2, budget + 1))
            return budget

        streams, new_docs, offset = [], [], [0]

        def build_epoch(_epoch: int) -> np.ndarray:
            order = rng.permutation(len(firsts))
            first, lens = firsts[order], lasts[order] - firsts[order]
            doc = np.repeat(np.arange(len(order)), lens)
            stream = np.arange(int(lens.sum()), dtype=np.int64)
            stream += np.repeat(first - (np.cumsum(lens) - lens), lens)
            keep = sizes[stream] > 0
            stream, doc = stream[keep], doc[keep]
            new_doc = np.ones(len(stream), dtype=bool)
            new_doc[1:] = doc[1:] != doc[:-1]
            rows = pack_sentences(sizes[stream].tolist(), new_doc.tolist(), run_budget)
            rows += offset[0]
            offset[0] += len(stream)
            streams.append(stream)
            new_docs.append(new_doc)
            return rows[rng.permutation(len(rows))]

        mapping = epochs_until(self.owner, build_epoch, self.max_num_samples)
        self._stream = np.concatenate(streams)
        self._stream_new_doc = np.concatenate(new_docs)
        return mapping

    @property
    def stream(self) -> np.ndarray:
        """Sentence ids of all epochs, laid end to end (documents shuffled per epoch)."""
        return self._built("_stream")

    @property
    def stream_new_doc(self) -> np.ndarray:
        """True where a document's text starts in :attr:`stream`."""
        return self._built("_stream_new_doc")

    def get_segments(self, idx: int) -> list[np.ndarray]:
        """The token ids of sample ``idx``, one array per document part (before specials)."""
        start, end = (int(x) for x in self.samples_mapping[idx])
        segments: list[list[np.ndarray]] = []
        for pos in range(start, end):
            if pos == start or self.stream_new_doc[pos]:
                segments.append([])
            segments[-1].append(self.indexed_dataset.get(int(self.stream[pos])))
        return [np.concatenate(parts) for parts in segments]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        segments = self.get_segments(idx)
        budget = self.max_seq_length - 1 - len(segments)
        if sum(len(s) for s in segments) > budget:  # a single over-long sentence
            segments = [segments[0][:budget]]
        parts = [np.asarray([self.cls_id], np.int64)]
        for seg in segments:
            parts += [seg.astype(np.int64), np.asarray([self.sep_id], np.int64)]
        tokens = np.concatenate(parts)
        candidates = np.ones(len(tokens), dtype=bool)
        candidates[0] = False  # <s>
        ends = np.cumsum([len(p) for p in parts]) - 1
        candidates[ends[2::2]] = False  # each </s>
        return masked_lm_sample(
            tokens,
            np.zeros(len(tokens), dtype=np.int64),
            candidates,
            self.max_seq_length,
            self.pad_id,
            self.mask_id,
            self.vocab_size,
            self.mask_lm_prob,
            self.sample_rng(idx),
            self.masker,
            self.max_seq_length - 2,
        )


def pack_sentences(sizes: list[int], new_doc: list[bool], budget) -> np.ndarray:
    """Greedy full-sentence packing: ``int64[n, 2]`` (start, end) runs of the sentence stream.

    A run's cost is its tokens plus one per document part (its ``</s>``); a run is closed
    when the next sentence would push the cost past its budget (``budget``: an int, or a
    function giving each new run's budget). A sentence that alone exceeds the budget forms a
    run by itself (it is cut to the sample length when read).
    """
    next_budget = budget if callable(budget) else (lambda: budget)
    rows = []
    start, cost, limit = 0, 0, next_budget()
    for pos, (size, new) in enumerate(zip(sizes, new_doc)):
        add = size + (1 if (new or pos == start) else 0)
        if pos > start and cost + add > limit:
            rows.append((start, pos))
            start, cost, limit = pos, 0, next_budget()
            add = size + 1
        cost += add
    if sizes:
        rows.append((start, len(sizes)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)
