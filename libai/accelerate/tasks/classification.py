"""Sequence classification (run_glue) and token classification (run_ner, strict IOB2
entities)."""

from __future__ import annotations

import logging

import torch

from libai.accelerate.hub_data import infer_text_columns
from libai.accelerate.tasks.common import (
    CHUNK,
    IGNORE_INDEX,
    MODEL_INPUTS,
    Prepared,
    Task,
    TensorDictDataset,
    add_to_sums,
    check_columns,
    column_texts,
    encode_padded,
    ensure_pad_token,
    iob2_spans,
    is_iob2,
    label_ids_of,
    label_kwargs,
    label_names_of,
    long_tensor,
    named_splits,
    ratio,
    require_fast_tokenizer,
    seq_length_setting,
    task_setting,
)

logger = logging.getLogger(__name__)


class SequenceClassification(Task):
    """1 or 2 text columns -> one label. ``accuracy``; ``f1``: of class 1 with two labels,
    else macro over the classes that occur in labels or predictions (sklearn's macro F1).
    Fractions in [0, 1]."""

    name = "sequence_classification"
    auto_model = "AutoModelForSequenceClassification"
    metrics = ("accuracy", "f1")

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = seq_length_setting(args)
        columns = task_setting(args, "text_columns", None)
        if columns is None:  # GLUE / SuperGLUE's columns
            columns = infer_text_columns(train.column_names)
            logger.info("text columns %s (inferred; --text-columns to choose)", columns)
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",") if c.strip()]
        columns = list(columns)
        if not 1 <= len(columns) <= 2:
            raise ValueError(f"text_columns takes 1 or 2 columns, got {columns}")
        label_column = task_setting(args, "label_column", "label")
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [*columns, label_column], hint)
        names = label_names_of(splits, label_column, per_token=False)
        if len(names) < 2:
            raise ValueError(
                f"column {label_column!r} holds one class only ({names}); sequence "
                "classification needs two or more (regression is not a task here)"
            )
        # explicit: transformers would guess regression for num_labels == 1 or float labels
        model_kwargs = {**label_kwargs(names), "problem_type": "single_label_classification"}
        ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            texts = [column_texts(dataset, c, hint) for c in columns]
            tensors = encode_padded(tokenizer, texts, seq_length)
            tensors["labels"] = long_tensor(label_ids_of(dataset, label_column, names, hint, False))
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
        add_to_sums(sums, "correct", hit.sum().item())
        add_to_sums(sums, "count", labels.numel())
        for c in range(num_labels):
            add_to_sums(sums, f"true_positive/{c}", true_pos[c])
            add_to_sums(sums, f"predicted/{c}", predicted[c])
            add_to_sums(sums, f"gold/{c}", gold[c])

    def compute(self, sums: dict) -> dict[str, float]:
        num_labels = sum(k.startswith("gold/") for k in sums)

        def f1(c):  # 2 tp / (2 tp + fp + fn)
            return ratio(2 * sums[f"true_positive/{c}"], sums[f"predicted/{c}"] + sums[f"gold/{c}"])

        if num_labels == 2:
            f1_value = f1(1)
        else:
            seen = [c for c in range(num_labels) if sums[f"predicted/{c}"] + sums[f"gold/{c}"]]
            f1_value = ratio(sum(f1(c) for c in seen), len(seen))
        return {
            "accuracy": ratio(sums.get("correct", 0.0), sums.get("count", 0.0)),
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
        seq_length = seq_length_setting(args)
        tokens_column = task_setting(args, "tokens_column", "tokens")
        label_column = task_setting(args, "label_column", "ner_tags")
        require_fast_tokenizer(tokenizer, self.name)
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [tokens_column, label_column], hint)
        names = label_names_of(splits, label_column, per_token=True)
        self.label_names = names
        self.iob2 = is_iob2(names)
        self.metrics = type(self).metrics if self.iob2 else ("accuracy",)
        model_kwargs = label_kwargs(names)
        ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            words = list(dataset[tokens_column])
            tags = label_ids_of(dataset, label_column, names, hint, per_token=True)
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
            out.append(TensorDictDataset({k: long_tensor(v) for k, v in tensors.items()}))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)

    def update(self, sums: dict, batch: dict, outputs) -> None:
        if self.label_names is None:
            raise RuntimeError("token_classification: call prepare() before update()")
        preds = outputs["logits"].detach().argmax(-1)
        labels = batch["labels"].to(preds.device)
        keep = labels != IGNORE_INDEX
        add_to_sums(sums, "tokens_correct", ((preds == labels) & keep).sum().item())
        add_to_sums(sums, "tokens", keep.sum().item())
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
        add_to_sums(sums, "entities_true_positive", true_pos)
        add_to_sums(sums, "entities_predicted", predicted)
        add_to_sums(sums, "entities_gold", gold)

    def compute(self, sums: dict) -> dict[str, float]:
        out = {"accuracy": ratio(sums.get("tokens_correct", 0.0), sums.get("tokens", 0.0))}
        if "precision" in self.metrics:
            true_pos = sums.get("entities_true_positive", 0.0)
            precision = ratio(true_pos, sums.get("entities_predicted", 0.0))
            recall = ratio(true_pos, sums.get("entities_gold", 0.0))
            out = {
                "precision": precision,
                "recall": recall,
                "f1": ratio(2 * precision * recall, precision + recall),
                **out,
            }
        return out
