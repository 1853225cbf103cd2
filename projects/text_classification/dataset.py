"""The project's dataset: libai's ``TextClassificationDataset`` with one label list.

A classifier's output ``i`` means one label, so the training and the validation file must
number their labels alike, and the model must have one output per label. Inferred on each
file separately, a validation file that lacks a class (or holds one the training file does
not) would shift the ids. :class:`LabeledTextDataset` takes the label names from the
training file (or from the config), applies them to every file, checks them against
``num_labels``, and writes them to ``OUTPUT_DIR/labels.json`` so that ``predict.py`` can
name its answers.
"""

from __future__ import annotations

import json
import os

from libai import dist
from libai.data.datasets.text_classification import TextClassificationDataset

#: the file, in the training output directory, holding the label names (index = class id)
LABELS_FILE = "labels.json"


class LabeledTextDataset(TextClassificationDataset):
    """Sentences (or sentence pairs) with labels numbered by one shared label list.

    Args:
        data_path, tokenizer, text_columns, label_column, max_seq_length: as in
            :class:`~libai.data.datasets.text_classification.TextClassificationDataset`
            (``.csv``, ``.tsv``, ``.json`` / ``.jsonl``; one text column or two).
        num_labels: the classifier's number of outputs (``model.cfg.num_labels``); the label
            list must have exactly this many names. ``None`` skips the check.
        labels: the label names, index = class id (``["negative", "positive"]``). ``None``
            takes them from ``labels_from``: text labels in sorted order, integer labels
            ``0 .. num_labels - 1`` as they are.
        labels_from: the file whose labels give the names when ``labels`` is ``None``:
            ``None`` = ``data_path`` itself (the training set); the validation set names the
            training file.
        output_dir: rank 0 writes ``labels.json`` there (``None``: nowhere).
        **kwargs: ``file_format``, ``has_header``.

    Attributes: ``label_names`` (the list), plus those of ``TextClassificationDataset``.

    Raises:
        ValueError: the label count differs from ``num_labels`` (the message names the file,
            the labels and the key to set), fewer than 2 labels, numeric non-integer labels
            (regression), or a row label outside ``labels``; the dataset's own errors (missing
            column, empty text, ...) name the file and row.
        FileNotFoundError: ``data_path`` or ``labels_from`` does not exist.
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        text_columns=("sentence",),
        label_column="label",
        max_seq_length: int = 128,
        num_labels: int | None = None,
        labels=None,
        labels_from=None,
        output_dir=None,
        **kwargs,
    ):
        common = dict(
            tokenizer=tokenizer,
            text_columns=text_columns,
            label_column=label_column,
            max_seq_length=max_seq_length,
            **kwargs,
        )
        reads_itself = labels_from is None or _same_file(labels_from, data_path)
        if labels is not None:  # the config's list: checked before any file is read
            labels = [str(name) for name in labels]
            check_num_labels(labels, num_labels, "the labels given in the config")
        elif not reads_itself:
            source = TextClassificationDataset(labels_from, **common)
            labels = label_names(source, num_labels)
            check_num_labels(labels, num_labels, _where(source))
        super().__init__(data_path, label_map=labels, **common)
        if labels is None:
            labels = label_names(self, num_labels)
            check_num_labels(labels, num_labels, _where(self))
        #: label names, index = class id
        self.label_names = labels
        if output_dir and dist.is_main_process():
            self.save_labels(output_dir)

    def save_labels(self, output_dir) -> str:
        """Write ``labels.json`` (label names and how texts are read) into ``output_dir``."""
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, LABELS_FILE)
        record = {
            "labels": self.label_names,
            "text_columns": list(self.text_columns),
            "label_column": self.label_column,
            "max_seq_length": self.max_seq_length,
            "train_file": os.path.abspath(self.data_path),
        }
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
        return path


def label_names(dataset: TextClassificationDataset, num_labels: int | None) -> list[str]:
    """The label names of a dataset whose labels were inferred: its text labels by id, or
    ``"0" .. "num_labels - 1"`` for integer class ids."""
    if dataset.label_map is not None:
        return sorted(dataset.label_map, key=dataset.label_map.get)
    if any(isinstance(label, float) for label in dataset.labels):
        raise ValueError(
            f"{dataset.data_path}, column {dataset.label_column!r}: the labels are numbers "
            "that are not all integers (regression targets); this project classifies. Use "
            "text labels or class ids 0, 1, ..."
        )
    count = dataset.num_labels if num_labels is None else max(int(num_labels), dataset.num_labels)
    return [str(i) for i in range(count)]


def check_num_labels(names: list[str], num_labels: int | None, source: str) -> None:
    """``names`` (read from ``source``) must hold at least 2 labels, and ``num_labels`` of
    them when given."""
    if len(names) < 2:
        raise ValueError(
            f"{source}: only {len(names)} label {names}; a classifier needs at least 2. Check "
            "the label column, or list the labels in the config."
        )
    if num_labels is not None and len(names) != int(num_labels):
        raise ValueError(
            f"{source}: {len(names)} labels {names}, but num_labels is {num_labels}; set "
            f"model.cfg.num_labels={len(names)} (the datasets' num_labels follows it)."
        )


def _where(dataset: TextClassificationDataset) -> str:
    return f"{dataset.data_path}, column {dataset.label_column!r}"


def read_labels(output_dir) -> dict:
    """The ``labels.json`` a training run wrote into ``output_dir``."""
    path = os.path.join(os.fspath(output_dir), LABELS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: it is written by training with this project's config "
            "(LabeledTextDataset with output_dir); pass the training output directory."
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _same_file(a, b) -> bool:
    a, b = os.fspath(a), os.fspath(b)
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.abspath(a) == os.path.abspath(b)
