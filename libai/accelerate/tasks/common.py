"""What every task shares: constants, the dataset classes, reading settings, columns and
labels, metric helpers, and the :class:`Task` interface."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

logger = logging.getLogger(__name__)


IGNORE_INDEX = -100  # labels the loss skips (torch's cross_entropy default)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
CHUNK = 1000  # rows per tokenizer call
N_BEST = 20  # question answering: start / end candidates searched


@dataclass
class Prepared:
    """What :meth:`Task.prepare` returns: map-style datasets of equal-shape tensor dicts and
    the keyword arguments for ``AutoModelFor*.from_pretrained``."""

    train: torch.utils.data.Dataset
    valid: torch.utils.data.Dataset | None
    model_kwargs: dict = field(default_factory=dict)


class TensorDictDataset(torch.utils.data.Dataset):
    """``dataset[i] == {key: tensors[key][i]}``; every tensor has the same first dimension."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        lengths = {len(v) for v in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(
                f"tensors of different lengths: { {k: len(v) for k, v in tensors.items()} }"
            )
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.tensors.items()}


class MaskedLMDataset(TensorDictDataset):
    """Blocks of token ids masked BERT-style in ``__getitem__``: each non-special token is
    chosen with ``probability``; of those 80% become ``mask_token_id``, 10% a random id below
    ``vocab_size``, 10% stay. ``labels`` hold the chosen tokens' ids, -100 elsewhere.

    The draw depends only on ``(seed, epoch, index)``, so every rank, worker and run masks a
    sample the same way. ``epoch`` is 0 (static masks) unless :meth:`set_epoch` changes it."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        special_tokens_mask: torch.Tensor,
        *,
        mask_token_id: int,
        vocab_size: int,
        probability: float,
        seed: int,
    ):
        super().__init__(tensors)
        self.special_tokens_mask = special_tokens_mask.bool()
        self.mask_token_id = int(mask_token_id)
        self.vocab_size = int(vocab_size)
        self.probability = float(probability)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, index) -> dict[str, torch.Tensor]:
        index = int(index)
        item = super().__getitem__(index)
        input_ids = item["input_ids"].clone()
        rng = np.random.default_rng([self.seed, self.epoch, index])
        draw = torch.from_numpy(rng.random((3, input_ids.numel())))
        chosen = (draw[0] < self.probability) & ~self.special_tokens_mask[index]
        to_mask = chosen & (draw[1] < 0.8)
        to_random = chosen & ~to_mask & (draw[2] < 0.5)
        item["labels"] = torch.where(chosen, input_ids, IGNORE_INDEX)
        input_ids[to_mask] = self.mask_token_id
        n_random = int(to_random.sum())
        input_ids[to_random] = torch.from_numpy(rng.integers(self.vocab_size, size=n_random))
        item["input_ids"] = input_ids
        return item


# ---- helpers ------------------------------------------------------------------------------------
def task_setting(args, name: str, default):
    value = getattr(args, name, None)
    return default if value is None else value


def seq_length_setting(args) -> int:
    value = getattr(args, "seq_length", None)
    if value is None or int(value) < 2:
        raise ValueError(f"args.seq_length must be an integer >= 2, got {value!r}")
    return int(value)


def file_hints(args) -> tuple[str, str]:
    train = getattr(args, "data_path", None) or getattr(args, "train_file", None)
    valid = getattr(args, "validation_path", None) or getattr(args, "valid_file", None)
    return train or "the training data", valid or "the validation data"


def named_splits(train, valid, args):
    """``[(dataset, path hint)]`` for the splits given; each must have rows."""
    out = []
    for dataset, hint in zip((train, valid), file_hints(args)):
        if dataset is None:
            continue
        if len(dataset) == 0:
            raise ValueError(f"{hint} has no rows")
        out.append((dataset, hint))
    if not out or out[0][0] is not train:
        raise ValueError("no training data")
    return out


def check_columns(dataset, names, path_hint: str) -> None:
    """Raise ValueError naming the first missing column, the file and the columns found."""
    found = list(dataset.column_names)
    for name in names:
        if name not in found:
            raise ValueError(f"column {name!r} not found in {path_hint}; columns found: {found}")


def column_texts(dataset, column: str, hint: str) -> list[str]:
    values = list(dataset[column])
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"{hint}: column {column!r} row {row} is not text: {value!r}")
    return values


def ensure_pad_token(tokenizer, model_kwargs: dict) -> None:
    """Padding needs a pad token: tokenizers without one (GPT-2, Llama) get their EOS token,
    and the model config the same ``pad_token_id`` (the tokenizer object is changed)."""
    if tokenizer.pad_token is not None:
        return
    if tokenizer.eos_token is None:
        raise ValueError("the tokenizer has neither a pad token nor an EOS token to pad with")
    tokenizer.pad_token = tokenizer.eos_token
    model_kwargs["pad_token_id"] = tokenizer.pad_token_id
    logger.info(
        "the tokenizer has no pad token: padding with its EOS token %r", tokenizer.eos_token
    )


def require_fast_tokenizer(tokenizer, task: str) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{task} needs a fast (Rust `tokenizers`) tokenizer for word ids / offsets; "
            f"{type(tokenizer).__name__} is not one"
        )


def long_tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def encode_padded(tokenizer, columns: list[list[str]], max_length: int) -> dict[str, torch.Tensor]:
    """Model inputs of 1 or 2 text columns, truncated and padded to ``max_length``."""
    out: dict[str, list] = {}
    for lo in range(0, len(columns[0]), CHUNK):
        enc = tokenizer(
            *[c[lo : lo + CHUNK] for c in columns],
            truncation=True,
            max_length=max_length,
            padding="max_length",
        )
        for key in MODEL_INPUTS:
            if key in enc:
                out.setdefault(key, []).extend(enc[key])
    return {k: long_tensor(v) for k, v in out.items()}


def add_to_sums(sums: dict, key: str, value) -> None:
    sums[key] = sums.get(key, 0.0) + float(value)


# ---- labels ---------------------------------------------------------------------------------------
def inner_feature(feature, per_token: bool):
    """The ClassLabel of a column (of its sequence for per-token labels), else None."""
    from datasets import ClassLabel

    if per_token:
        feature = getattr(feature, "feature", None)
    return feature if isinstance(feature, ClassLabel) else None


def label_names_of(splits, column: str, per_token: bool) -> list[str]:
    """A ClassLabel's names (train's), ``LABEL_i`` for integer labels (0 .. max over all
    splits), else the sorted set of string labels (over all splits)."""
    class_label = inner_feature(splits[0][0].features[column], per_token)
    if class_label is not None:
        return list(class_label.names)
    values = []
    for dataset, hint in splits:
        feature = inner_feature(dataset.features[column], per_token)
        if feature is not None:  # train plain, valid ClassLabel: its names count as strings
            values.extend(feature.names)
            continue
        for row, value in enumerate(dataset[column]):
            items = value if per_token else [value]
            if per_token and not isinstance(value, (list, tuple)):
                raise ValueError(f"{hint}: column {column!r} row {row} is not a list: {value!r}")
            values.extend(items)
    if not values:
        raise ValueError(f"column {column!r} has no labels")
    if all(isinstance(v, (int, np.integer)) for v in values):
        if min(values) < 0:
            raise ValueError(f"column {column!r}: labels must be >= 0, found {min(values)}")
        return [f"LABEL_{i}" for i in range(int(max(values)) + 1)]
    if all(isinstance(v, str) for v in values):
        return sorted(set(values))
    odd = next((v for v in values if not isinstance(v, (str, int, np.integer))), None)
    if odd is None:
        raise ValueError(f"column {column!r} mixes class names and integer ids")
    raise ValueError(
        f"column {column!r}: labels must be class names or integer ids (regression is not a "
        f"task here), found {odd!r}"
    )


def label_ids_of(dataset, column: str, names: list[str], hint: str, per_token: bool) -> list:
    """The column's labels as ids into ``names`` (a list per row for per-token labels)."""
    label2id = {name: i for i, name in enumerate(names)}
    feature = inner_feature(dataset.features[column], per_token)
    remap = None
    if feature is not None and list(feature.names) != names:
        remap = [label2id.get(name) for name in feature.names]

    def one(value, row):
        if remap is not None:
            name = feature.names[value] if 0 <= value < len(remap) else value
            value = remap[value] if 0 <= value < len(remap) else None
            if value is None:
                raise ValueError(
                    f"{hint}: row {row}: label {name!r} is not one of the labels {names}"
                )
        elif isinstance(value, str):
            if value not in label2id:
                raise ValueError(
                    f"{hint}: row {row}: label {value!r} is not one of the labels {names}"
                )
            value = label2id[value]
        elif not 0 <= int(value) < len(names):
            raise ValueError(f"{hint}: row {row}: label id {value} is outside 0..{len(names) - 1}")
        return int(value)

    rows = list(dataset[column])
    if per_token:
        return [[one(v, row) for v in values] for row, values in enumerate(rows)]
    return [one(v, row) for row, v in enumerate(rows)]


def label_kwargs(names: list[str]) -> dict:
    return {
        "num_labels": len(names),
        "id2label": dict(enumerate(names)),
        "label2id": {name: i for i, name in enumerate(names)},
    }


# ---- metrics helpers --------------------------------------------------------------------------------
def iob2_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    """Entities ``(type, first, last)`` of a tag sequence in strict IOB2 (seqeval's
    ``mode="strict", scheme=IOB2``): ``B-X`` followed by the longest run of ``I-X``. An ``I-X``
    that does not continue a ``B-X`` / ``I-X`` of the same type starts no entity."""
    spans = []
    i = 0
    while i < len(tags):
        if tags[i].startswith("B-"):
            kind, j = tags[i][2:], i + 1
            while j < len(tags) and tags[j] == "I-" + kind:
                j += 1
            spans.append((kind, i, j - 1))
            i = j
        else:
            i += 1
    return spans


def is_iob2(names: list[str]) -> bool:
    return any(n.startswith("B-") for n in names) and all(
        n == "O" or n.startswith(("B-", "I-")) for n in names
    )


def ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def perplexity_of(loss_sum: float, tokens: float) -> float:
    if not tokens:
        return float("nan")
    mean = loss_sum / tokens
    return math.exp(mean) if mean < 700 else float("inf")


def span_scores(pred: tuple[int, int], gold: tuple[int, int]) -> tuple[float, float]:
    """Exact match and token-overlap F1 of two inclusive token spans; (0, 0) is "no answer"."""
    if pred == (0, 0) or gold == (0, 0):
        same = float(pred == gold)
        return same, same
    overlap = min(pred[1], gold[1]) - max(pred[0], gold[0]) + 1
    if overlap <= 0:
        return 0.0, 0.0
    precision = overlap / (pred[1] - pred[0] + 1)
    recall = overlap / (gold[1] - gold[0] + 1)
    return float(pred == gold), 2 * precision * recall / (precision + recall)


# ---- tasks ------------------------------------------------------------------------------------------
class Task:
    """One fine-tuning task. :meth:`prepare` keeps per-run state on the instance (label names,
    question-answering context spans) that :meth:`update` reads: :func:`get_task` returns the
    shared instance of ``TASKS``, so the caller's prepare and its evaluation meet (one run per
    process; the last prepare wins)."""

    name: str = ""
    auto_model: str = ""
    metrics: tuple[str, ...] = ()

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        raise NotImplementedError

    def update(self, sums: dict, batch: dict, outputs) -> None:
        raise NotImplementedError

    def compute(self, sums: dict) -> dict[str, float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, auto_model={self.auto_model!r})"
