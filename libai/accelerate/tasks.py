"""The tasks of the black-box fine-tuning CLI: data in, tensors out, metrics back.

Each :class:`Task` turns local ``datasets.Dataset`` rows into fixed-length items for an
unmodified Hugging Face model (``transformers``' names: ``input_ids``, ``attention_mask``,
``token_type_ids`` when the tokenizer gives them, ``labels`` / ``start_positions`` /
``end_positions``), names the ``transformers`` Auto class that builds the model, and reduces
evaluation batches to additive sums (so the caller can all-reduce them over data-parallel
ranks) that :meth:`Task.compute` turns into metrics.

Conventions (transformers' example scripts): run_glue (sequence classification), run_ner
(first sub-token of each word labelled), run_qa (offset mapping -> token positions; one
feature per example here, no doc stride), run_mlm / run_clm (``group_texts`` blocks, the
remainder dropped), run_summarization (target ids padded with -100).

``args`` is any object; every attribute is read with ``getattr`` and a default, ``None``
meaning "the default": ``seq_length`` (required), ``seed`` (1234), ``text_columns``
(``["sentence"]``), ``label_column`` (``"label"``; ``"ner_tags"`` for tokens),
``tokens_column`` (``"tokens"``), ``question_column`` / ``context_column`` /
``answers_column`` (``"question"`` / ``"context"`` / ``"answers"``), ``max_answer_length``
(30), ``text_column`` (``"text"``), ``mlm_probability`` (0.15), ``source_column`` /
``target_column`` (``"source"`` / ``"target"``), ``target_length`` (``seq_length``);
``data_path`` / ``validation_path`` (else ``train_file`` / ``valid_file``) only name the files
in error messages.

``pretraining`` (Megatron ``.bin/.idx`` data built by the caller) has no prepare step here,
only its perplexity metric.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "MaskedLMDataset",
    "Prepared",
    "Task",
    "TensorDictDataset",
    "check_columns",
    "get_task",
    "iob2_spans",
]

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
def _setting(args, name: str, default):
    value = getattr(args, name, None)
    return default if value is None else value


def _seq_length(args) -> int:
    value = getattr(args, "seq_length", None)
    if value is None or int(value) < 2:
        raise ValueError(f"args.seq_length must be an integer >= 2, got {value!r}")
    return int(value)


def _hints(args) -> tuple[str, str]:
    train = getattr(args, "data_path", None) or getattr(args, "train_file", None)
    valid = getattr(args, "validation_path", None) or getattr(args, "valid_file", None)
    return train or "the training data", valid or "the validation data"


def _splits(train, valid, args):
    """``[(dataset, path hint)]`` for the splits given; each must have rows."""
    out = []
    for dataset, hint in zip((train, valid), _hints(args)):
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


def _texts(dataset, column: str, hint: str) -> list[str]:
    values = list(dataset[column])
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"{hint}: column {column!r} row {row} is not text: {value!r}")
    return values


def _ensure_pad_token(tokenizer, model_kwargs: dict) -> None:
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


def _require_fast(tokenizer, task: str) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{task} needs a fast (Rust `tokenizers`) tokenizer for word ids / offsets; "
            f"{type(tokenizer).__name__} is not one"
        )


def _long(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def _encode_padded(tokenizer, columns: list[list[str]], max_length: int) -> dict[str, torch.Tensor]:
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
    return {k: _long(v) for k, v in out.items()}


def _add(sums: dict, key: str, value) -> None:
    sums[key] = sums.get(key, 0.0) + float(value)


# ---- labels ---------------------------------------------------------------------------------------
def _inner_feature(feature, per_token: bool):
    """The ClassLabel of a column (of its sequence for per-token labels), else None."""
    from datasets import ClassLabel

    if per_token:
        feature = getattr(feature, "feature", None)
    return feature if isinstance(feature, ClassLabel) else None


def _label_names(splits, column: str, per_token: bool) -> list[str]:
    """A ClassLabel's names (train's), ``LABEL_i`` for integer labels (0 .. max over all
    splits), else the sorted set of string labels (over all splits)."""
    class_label = _inner_feature(splits[0][0].features[column], per_token)
    if class_label is not None:
        return list(class_label.names)
    values = []
    for dataset, hint in splits:
        feature = _inner_feature(dataset.features[column], per_token)
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


def _label_ids(dataset, column: str, names: list[str], hint: str, per_token: bool) -> list:
    """The column's labels as ids into ``names`` (a list per row for per-token labels)."""
    label2id = {name: i for i, name in enumerate(names)}
    feature = _inner_feature(dataset.features[column], per_token)
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


def _label_kwargs(names: list[str]) -> dict:
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


def _is_iob2(names: list[str]) -> bool:
    return any(n.startswith("B-") for n in names) and all(
        n == "O" or n.startswith(("B-", "I-")) for n in names
    )


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _perplexity(loss_sum: float, tokens: float) -> float:
    if not tokens:
        return float("nan")
    mean = loss_sum / tokens
    return math.exp(mean) if mean < 700 else float("inf")


def _span_scores(pred: tuple[int, int], gold: tuple[int, int]) -> tuple[float, float]:
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


class SequenceClassification(Task):
    """1 or 2 text columns -> one label. ``accuracy``; ``f1``: of class 1 with two labels,
    else macro over the classes that occur in labels or predictions (sklearn's macro F1).
    Fractions in [0, 1]."""

    name = "sequence_classification"
    auto_model = "AutoModelForSequenceClassification"
    metrics = ("accuracy", "f1")

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        columns = _setting(args, "text_columns", ["sentence"])
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",") if c.strip()]
        columns = list(columns)
        if not 1 <= len(columns) <= 2:
            raise ValueError(f"text_columns takes 1 or 2 columns, got {columns}")
        label_column = _setting(args, "label_column", "label")
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [*columns, label_column], hint)
        names = _label_names(splits, label_column, per_token=False)
        if len(names) < 2:
            raise ValueError(
                f"column {label_column!r} holds one class only ({names}); sequence "
                "classification needs two or more (regression is not a task here)"
            )
        # explicit: transformers would guess regression for num_labels == 1 or float labels
        model_kwargs = {**_label_kwargs(names), "problem_type": "single_label_classification"}
        _ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            texts = [_texts(dataset, c, hint) for c in columns]
            tensors = _encode_padded(tokenizer, texts, seq_length)
            tensors["labels"] = _long(_label_ids(dataset, label_column, names, hint, False))
            out.append(TensorDictDataset(tensors))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)

    def update(self, sums: dict, batch: dict, outputs) -> None:
        logits = outputs["logits"].detach()
        num_labels = logits.shape[-1]
        preds = logits.argmax(-1).reshape(-1)
        labels = batch["labels"].to(preds.device).reshape(-1)
        hit = preds == labels
        true_pos = torch.bincount(labels[hit], minlength=num_labels).tolist()
        predicted = torch.bincount(preds, minlength=num_labels).tolist()
        gold = torch.bincount(labels, minlength=num_labels).tolist()
        _add(sums, "correct", hit.sum().item())
        _add(sums, "count", labels.numel())
        for c in range(num_labels):
            _add(sums, f"true_positive/{c}", true_pos[c])
            _add(sums, f"predicted/{c}", predicted[c])
            _add(sums, f"gold/{c}", gold[c])

    def compute(self, sums: dict) -> dict[str, float]:
        num_labels = sum(k.startswith("gold/") for k in sums)

        def f1(c):  # 2 tp / (2 tp + fp + fn)
            return _ratio(
                2 * sums[f"true_positive/{c}"], sums[f"predicted/{c}"] + sums[f"gold/{c}"]
            )

        if num_labels == 2:
            f1_value = f1(1)
        else:
            seen = [c for c in range(num_labels) if sums[f"predicted/{c}"] + sums[f"gold/{c}"]]
            f1_value = _ratio(sum(f1(c) for c in seen), len(seen))
        return {
            "accuracy": _ratio(sums.get("correct", 0.0), sums.get("count", 0.0)),
            "f1": f1_value,
        }


class TokenClassification(Task):
    """Words -> one tag each; the first sub-token of a word carries its tag, the others and the
    special tokens -100 (run_ner). Words cut off by ``seq_length`` are neither trained nor
    scored. ``accuracy`` over labelled tokens; with IOB2 tag names (``B-X`` / ``I-X`` / ``O``)
    also entity-level ``precision`` / ``recall`` / ``f1`` (micro, strict IOB2, like seqeval's
    strict mode; run_ner's default seqeval mode also counts entities opened by a stray
    ``I-X``). Fractions in [0, 1]. ``metrics`` is set by :meth:`prepare` (accuracy alone for
    tags that are not IOB2)."""

    name = "token_classification"
    auto_model = "AutoModelForTokenClassification"
    metrics = ("precision", "recall", "f1", "accuracy")

    def __init__(self):
        self.label_names: list[str] | None = None
        self.iob2 = False

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        tokens_column = _setting(args, "tokens_column", "tokens")
        label_column = _setting(args, "label_column", "ner_tags")
        _require_fast(tokenizer, self.name)
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [tokens_column, label_column], hint)
        names = _label_names(splits, label_column, per_token=True)
        self.label_names = names
        self.iob2 = _is_iob2(names)
        self.metrics = type(self).metrics if self.iob2 else ("accuracy",)
        model_kwargs = _label_kwargs(names)
        _ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            words = list(dataset[tokens_column])
            tags = _label_ids(dataset, label_column, names, hint, per_token=True)
            for row, (w, t) in enumerate(zip(words, tags)):
                if not isinstance(w, (list, tuple)) or len(w) != len(t):
                    raise ValueError(
                        f"{hint}: row {row}: {tokens_column!r} must be a list of words with one "
                        f"tag each in {label_column!r}; got {w!r} and {len(t)} tags"
                    )
            tensors: dict[str, list] = {}
            for lo in range(0, len(words), CHUNK):
                enc = tokenizer(
                    [list(w) for w in words[lo : lo + CHUNK]],
                    is_split_into_words=True,
                    truncation=True,
                    max_length=seq_length,
                    padding="max_length",
                )
                for key in MODEL_INPUTS:
                    if key in enc:
                        tensors.setdefault(key, []).extend(enc[key])
                for i in range(len(enc["input_ids"])):
                    row_tags, labels, previous = tags[lo + i], [], None
                    for word in enc.word_ids(i):
                        first = word is not None and word != previous
                        labels.append(row_tags[word] if first else IGNORE_INDEX)
                        previous = word
                    tensors.setdefault("labels", []).append(labels)
            out.append(TensorDictDataset({k: _long(v) for k, v in tensors.items()}))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)

    def update(self, sums: dict, batch: dict, outputs) -> None:
        if self.label_names is None:
            raise RuntimeError("token_classification: call prepare() before update()")
        preds = outputs["logits"].detach().argmax(-1)
        labels = batch["labels"].to(preds.device)
        keep = labels != IGNORE_INDEX
        _add(sums, "tokens_correct", ((preds == labels) & keep).sum().item())
        _add(sums, "tokens", keep.sum().item())
        true_pos = predicted = gold = 0
        if self.iob2:
            names = self.label_names
            for p_row, l_row, k_row in zip(preds.tolist(), labels.tolist(), keep.tolist()):
                p_tags = [names[p] for p, k in zip(p_row, k_row) if k]
                g_tags = [names[g] for g, k in zip(l_row, k_row) if k]
                p_spans, g_spans = set(iob2_spans(p_tags)), set(iob2_spans(g_tags))
                true_pos += len(p_spans & g_spans)
                predicted += len(p_spans)
                gold += len(g_spans)
        _add(sums, "entities_true_positive", true_pos)
        _add(sums, "entities_predicted", predicted)
        _add(sums, "entities_gold", gold)

    def compute(self, sums: dict) -> dict[str, float]:
        out = {"accuracy": _ratio(sums.get("tokens_correct", 0.0), sums.get("tokens", 0.0))}
        if "precision" in self.metrics:
            true_pos = sums.get("entities_true_positive", 0.0)
            precision = _ratio(true_pos, sums.get("entities_predicted", 0.0))
            recall = _ratio(true_pos, sums.get("entities_gold", 0.0))
            out = {
                "precision": precision,
                "recall": recall,
                "f1": _ratio(2 * precision * recall, precision + recall),
                **out,
            }
        return out


class QuestionAnswering(Task):
    """SQuAD columns -> ``start_positions`` / ``end_positions`` of the first answer (run_qa's
    offset-mapping search, inside the context tokens); question first, ``only_second``
    truncation, ONE feature per example (no doc stride): an answer cut off by ``seq_length``
    (or an empty answer list) gets (0, 0). A question too long for ``seq_length`` falls back
    to ``longest_first`` truncation (logged) instead of failing.

    Metrics on token spans, in percent: the prediction is the best ``start + end`` logit pair
    among the top-20 starts and ends with ``start <= end`` inside the context and at most
    ``max_answer_length`` tokens ((0, 0) when none is valid); ``exact_match`` = same span,
    ``f1`` = token-overlap F1 of the spans (a (0, 0) gold scores 1 only for a (0, 0)
    prediction). This is NOT SQuAD's metric on normalized answer text, which needs the text
    post-processing of run_qa: span scores are usually close to, not equal to, it."""

    name = "question_answering"
    auto_model = "AutoModelForQuestionAnswering"
    metrics = ("exact_match", "f1")

    def __init__(self):
        self.max_answer_length = 30
        self.special_ids: set[int] = set()
        self.context_spans: dict[bytes, tuple[int, int]] = {}

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        columns = [
            _setting(args, "question_column", "question"),
            _setting(args, "context_column", "context"),
            _setting(args, "answers_column", "answers"),
        ]
        self.max_answer_length = int(_setting(args, "max_answer_length", 30))
        _require_fast(tokenizer, self.name)
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, columns, hint)
        model_kwargs: dict = {}
        _ensure_pad_token(tokenizer, model_kwargs)
        self.special_ids = set(tokenizer.all_special_ids)
        self.context_spans = {}
        out = []
        for split, (dataset, hint) in enumerate(splits):
            questions = [q.lstrip() for q in _texts(dataset, columns[0], hint)]
            contexts = _texts(dataset, columns[1], hint)
            answers = list(dataset[columns[2]])
            tensors: dict[str, list] = {}
            for lo in range(0, len(questions), CHUNK):
                hi = lo + CHUNK
                for enc, i, answer in zip(
                    *self._encode(tokenizer, questions[lo:hi], contexts[lo:hi], seq_length),
                    answers[lo:hi],
                ):
                    sequence_ids = enc.sequence_ids(i)
                    context = [k for k, s in enumerate(sequence_ids) if s == 1]
                    span = (context[0], context[-1]) if context else None
                    start, end = _answer_positions(enc["offset_mapping"][i], span, answer, hint)
                    for key in MODEL_INPUTS:
                        if key in enc:
                            tensors.setdefault(key, []).append(enc[key][i])
                    tensors.setdefault("start_positions", []).append(start)
                    tensors.setdefault("end_positions", []).append(end)
                    if split == 1:
                        self.context_spans[_row_key(enc["input_ids"][i])] = span or (0, 0)
            out.append(TensorDictDataset({k: _long(v) for k, v in tensors.items()}))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)

    @staticmethod
    def _encode(tokenizer, questions, contexts, seq_length):
        """``(encodings, row indices)``: one call for the chunk, or row by row when a question
        leaves no room for the context (``longest_first`` for those rows)."""
        common = dict(max_length=seq_length, padding="max_length", return_offsets_mapping=True)
        try:
            enc = tokenizer(questions, contexts, truncation="only_second", **common)
            return [enc] * len(questions), list(range(len(questions)))
        except Exception:  # the Rust tokenizer raises a bare Exception on truncation errors
            pass
        encodings, cut = [], 0
        for question, context in zip(questions, contexts):
            try:
                enc = tokenizer([question], [context], truncation="only_second", **common)
            except Exception:
                enc = tokenizer([question], [context], truncation="longest_first", **common)
                cut += 1
            encodings.append(enc)
        if cut:
            logger.warning(
                "%d question(s) leave no room for their context in seq_length %d: truncated "
                "longest_first",
                cut,
                seq_length,
            )
        return encodings, [0] * len(questions)

    def _context_span(self, input_ids: torch.Tensor) -> tuple[int, int]:
        """Context token range of a validation row (recorded by prepare); for other rows, the
        second run of non-special tokens (the first when there is only one)."""
        span = self.context_spans.get(_row_key(input_ids.tolist()))
        if span is not None:
            return span
        runs, start = [], None
        for k, token in enumerate(input_ids.tolist() + [None]):
            special = token is None or token in self.special_ids
            if special and start is not None:
                runs.append((start, k - 1))
                start = None
            elif not special and start is None:
                start = k
        return runs[1] if len(runs) > 1 else runs[0] if runs else (0, 0)

    def update(self, sums: dict, batch: dict, outputs) -> None:
        start_logits = outputs["start_logits"].detach().float().cpu()
        end_logits = outputs["end_logits"].detach().float().cpu()
        k = min(N_BEST, start_logits.shape[-1])
        top_starts = start_logits.topk(k, dim=-1).indices.tolist()
        top_ends = end_logits.topk(k, dim=-1).indices.tolist()
        gold_starts = batch["start_positions"].reshape(-1).tolist()
        gold_ends = batch["end_positions"].reshape(-1).tolist()
        input_ids = batch["input_ids"].cpu()
        start_scores, end_scores = start_logits.tolist(), end_logits.tolist()
        for row in range(start_logits.shape[0]):
            lo, hi = self._context_span(input_ids[row])
            best, pred = None, (0, 0)
            for s in top_starts[row]:
                for e in top_ends[row]:
                    if not (lo <= s <= e <= hi and e - s < self.max_answer_length):
                        continue
                    score = start_scores[row][s] + end_scores[row][e]
                    if best is None or score > best:
                        best, pred = score, (s, e)
            em, f1 = _span_scores(pred, (gold_starts[row], gold_ends[row]))
            _add(sums, "exact_match", em)
            _add(sums, "f1", f1)
            _add(sums, "count", 1)

    def compute(self, sums: dict) -> dict[str, float]:
        count = sums.get("count", 0.0)
        return {
            "exact_match": 100.0 * _ratio(sums.get("exact_match", 0.0), count),
            "f1": 100.0 * _ratio(sums.get("f1", 0.0), count),
        }


def _row_key(input_ids: list[int]) -> bytes:
    return hashlib.blake2b(np.asarray(input_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def _answer_positions(offsets, context, answer, hint: str) -> tuple[int, int]:
    """run_qa's token positions of the first answer, searched inside the context tokens
    ``context = (first, last)``; (0, 0) when there is none or it is cut off."""
    if isinstance(answer, (list, tuple)):  # [{"text": ..., "answer_start": ...}, ...]
        answer = answer[0] if answer else {}
        answer = {"text": [answer.get("text")], "answer_start": [answer.get("answer_start")]}
    if not isinstance(answer, dict):
        raise ValueError(f"{hint}: answers must be {{'text': [...], 'answer_start': [...]}}")
    texts, starts = answer.get("text") or [], answer.get("answer_start") or []
    if not texts or not starts or texts[0] is None or starts[0] is None or context is None:
        return 0, 0
    first, last = context
    start_char = int(starts[0])
    end_char = start_char + len(texts[0])
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return 0, 0
    start = first
    while start < last and offsets[start + 1][0] <= start_char:
        start += 1
    end = last
    while end > start and offsets[end - 1][1] >= end_char:
        end -= 1
    return start, end


class _LanguageModeling(Task):
    """Perplexity = exp(sum over batches of mean loss x predicted tokens / predicted tokens)."""

    metrics = ("perplexity",)

    @staticmethod
    def _predicted_tokens(labels: torch.Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def update(self, sums: dict, batch: dict, outputs) -> None:
        tokens = self._predicted_tokens(batch["labels"])
        loss = float(outputs["loss"].detach()) if tokens else 0.0  # no token: the loss is nan
        _add(sums, "loss_sum", loss * tokens)
        _add(sums, "tokens", tokens)

    def compute(self, sums: dict) -> dict[str, float]:
        return {"perplexity": _perplexity(sums.get("loss_sum", 0.0), sums.get("tokens", 0.0))}


def _grouped_blocks(dataset, column: str, hint: str, tokenizer, seq_length: int, specials: bool):
    """run_mlm / run_clm ``group_texts``: tokenize each non-empty text (with its special
    tokens), concatenate, cut into ``seq_length`` blocks, drop the remainder. Returns the
    tensors (all-ones ``attention_mask``) and, when asked, the special-tokens mask."""
    texts = [t for t in _texts(dataset, column, hint) if t.strip()]
    keys = [*MODEL_INPUTS, "special_tokens_mask"] if specials else list(MODEL_INPUTS)
    pieces: dict[str, list[np.ndarray]] = {}
    for lo in range(0, len(texts), CHUNK):
        enc = tokenizer(texts[lo : lo + CHUNK], return_special_tokens_mask=specials, verbose=False)
        for key in keys:
            if key in enc:
                pieces.setdefault(key, []).extend(np.asarray(r, dtype=np.int64) for r in enc[key])
    total = sum(len(r) for r in pieces.get("input_ids", []))
    blocks = total // seq_length
    if blocks == 0:
        raise ValueError(
            f"{hint}: {total} tokens in column {column!r}, fewer than one block of seq_length "
            f"{seq_length}"
        )
    tensors = {
        k: torch.from_numpy(np.concatenate(v)[: blocks * seq_length].reshape(blocks, seq_length))
        for k, v in pieces.items()
    }
    tensors["attention_mask"] = torch.ones(blocks, seq_length, dtype=torch.long)
    return tensors, tensors.pop("special_tokens_mask", None)


class MaskedLM(_LanguageModeling):
    """Texts grouped into blocks, masked per sample from ``(seed, index)`` (see
    :class:`MaskedLMDataset`). Perplexity over the masked tokens."""

    name = "masked_lm"
    auto_model = "AutoModelForMaskedLM"

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        column = _setting(args, "text_column", "text")
        probability = float(_setting(args, "mlm_probability", 0.15))
        seed = int(_setting(args, "seed", 1234))
        if tokenizer.mask_token_id is None:
            raise ValueError("masked_lm needs a tokenizer with a mask token")
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [column], hint)
        out = []
        for dataset, hint in splits:
            tensors, special = _grouped_blocks(dataset, column, hint, tokenizer, seq_length, True)
            if special is None:  # a tokenizer without the mask: protect its special ids
                special = torch.isin(tensors["input_ids"], torch.tensor(tokenizer.all_special_ids))
            out.append(
                MaskedLMDataset(
                    tensors,
                    special,
                    mask_token_id=tokenizer.mask_token_id,
                    vocab_size=len(tokenizer),
                    probability=probability,
                    seed=seed,
                )
            )
        return Prepared(out[0], out[1] if len(out) > 1 else None, {})


class CausalLM(_LanguageModeling):
    """Texts grouped into blocks; ``labels`` = ``input_ids`` (the model shifts). Perplexity over
    the predicted tokens (``seq_length - 1`` per block)."""

    name = "causal_lm"
    auto_model = "AutoModelForCausalLM"

    @staticmethod
    def _predicted_tokens(labels: torch.Tensor) -> int:
        return int((labels[..., 1:] != IGNORE_INDEX).sum())

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        column = _setting(args, "text_column", "text")
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [column], hint)
        out = []
        for dataset, hint in splits:
            tensors, _ = _grouped_blocks(dataset, column, hint, tokenizer, seq_length, False)
            tensors["labels"] = tensors["input_ids"]  # shared storage; collate copies
            out.append(TensorDictDataset(tensors))
        return Prepared(out[0], out[1] if len(out) > 1 else None, {})


class Seq2SeqLM(_LanguageModeling):
    """Source -> target (T5 / BART): the source padded to ``seq_length`` (``input_ids``,
    ``attention_mask``; never ``token_type_ids``), ``labels`` the target
    ids padded to ``target_length`` with -100 (the model builds ``decoder_input_ids`` from them).
    Perplexity over the target tokens."""

    name = "seq2seq_lm"
    auto_model = "AutoModelForSeq2SeqLM"

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = _seq_length(args)
        target_length = int(_setting(args, "target_length", seq_length))
        columns = [
            _setting(args, "source_column", "source"),
            _setting(args, "target_column", "target"),
        ]
        splits = _splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, columns, hint)
        model_kwargs: dict = {}
        _ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            tensors = _encode_padded(tokenizer, [_texts(dataset, columns[0], hint)], seq_length)
            tensors.pop("token_type_ids", None)  # no encoder-decoder model takes them
            targets = _texts(dataset, columns[1], hint)
            labels = []
            for lo in range(0, len(targets), CHUNK):
                enc = tokenizer(
                    text_target=targets[lo : lo + CHUNK],
                    truncation=True,
                    max_length=target_length,
                    padding="max_length",
                )
                for ids, mask in zip(enc["input_ids"], enc["attention_mask"]):
                    labels.append([t if m else IGNORE_INDEX for t, m in zip(ids, mask)])
            tensors["labels"] = _long(labels)
            out.append(TensorDictDataset(tensors))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)


class PreTraining(_LanguageModeling):
    """GPT pretraining on Megatron ``.bin/.idx`` data: the caller builds the datasets (items
    ``input_ids`` and next-token ``labels``, every token predicted), so there is nothing to
    prepare here. Perplexity over the labelled tokens."""

    name = "pretraining"
    auto_model = "AutoModelForCausalLM"

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        raise NotImplementedError(
            "pretraining data is Megatron's indexed .bin/.idx data, built by the caller "
            "(libai.accelerate.data.pretraining_datasets), not prepared from rows"
        )


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        SequenceClassification(),
        TokenClassification(),
        QuestionAnswering(),
        MaskedLM(),
        CausalLM(),
        Seq2SeqLM(),
        PreTraining(),
    )
}


def get_task(name: str) -> Task:
    """The task ``name`` (the shared instance: prepare() keeps per-run state on it)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]
