"""The collate function of ``build_data_loader`` when none is given: samples of one length
are stacked; ragged ones (a tokenized ``datasets`` split: lists of different lengths) are
padded by the tokenizer's collator (transformers' ``DataCollatorWithPadding``) when a
tokenizer is known, else to the longest with zeros (``attention_mask`` 0, ``labels`` -100)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

from libai.data.build import trivial_batch_collator

logger = logging.getLogger(__name__)

__all__ = ["PaddingCollator", "pad_to_longest"]

#: DataCollatorWithPadding's renames: the label column a model's forward takes as ``labels``
LABEL_NAMES = ("label", "label_ids")


def _needs_padding(samples: list) -> bool:
    """Rows of a tokenized ``datasets`` split (python lists) or samples of different
    shapes."""
    first = samples[0]
    if any(isinstance(v, list) for v in first.values()):
        return True
    for key, value in first.items():
        shape = torch.as_tensor(value).shape
        if any(torch.as_tensor(s[key]).shape != shape for s in samples[1:]):
            return True
    return False


def pad_to_longest(samples: list[Mapping]) -> dict[str, torch.Tensor]:
    """Pad every 1-d field to the longest sample (right side): ``attention_mask`` with 0,
    ``labels`` with -100, the rest with 0; ``label`` / ``label_ids`` become ``labels``."""
    if "attention_mask" not in samples[0]:
        raise ValueError(
            "build_data_loader: samples of different lengths without an attention_mask; pass "
            "collate_fn= or tokenizer= (or --pretrained-model-name-or-path for its tokenizer)"
        )
    batch = {}
    for key in samples[0]:
        values = [torch.as_tensor(s[key]) for s in samples]
        name = "labels" if key in LABEL_NAMES else key
        if values[0].dim() == 0:
            batch[name] = torch.stack(values)
            continue
        fill = 0 if key != "labels" else -100
        batch[name] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=fill)
    return batch


class PaddingCollator:
    """Stacks samples of one shape; pads token lists and ragged samples with the tokenizer of ``tokenizer()``
    (asked once, at the first ragged batch) or :func:`pad_to_longest`."""

    def __init__(self, tokenizer: Callable[[], object]):
        self._tokenizer, self._collate = tokenizer, None

    def _padder(self):
        if self._collate is None:
            tokenizer = self._tokenizer()
            if tokenizer is None:
                logger.info("build_data_loader: padding to the longest sample (no tokenizer known)")
                self._collate = pad_to_longest
            else:
                from transformers import DataCollatorWithPadding

                self._collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")
        return self._collate

    def __call__(self, samples: list):
        if not samples or not isinstance(samples[0], Mapping) or not _needs_padding(samples):
            return trivial_batch_collator(samples)
        return dict(self._padder()(samples))
