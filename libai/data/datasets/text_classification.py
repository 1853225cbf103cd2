"""Sentence / sentence-pair classification (or regression) samples from a local file.

CSV, TSV (tab-separated, unquoted, as GLUE's) or JSON (JSON lines, or one array of objects),
picked by the extension unless ``file_format`` says. The tokenizer's own ``tokenizers`` pipeline
encodes the texts, so framing, type ids and truncation are exactly ``transformers``': BERT
``[CLS] a [SEP] b [SEP]`` with type ids 0 / 1, RoBERTa ``<s> a </s></s> b </s>`` with type ids
0, pairs cut longest-first to ``max_seq_length``, then right-padded with the pad id.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

_FORMATS = {".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "json"}


def _columns(text_columns) -> tuple[str, ...]:
    """``"a,b"`` / ``("a", "b")`` / ``(0, 1)`` -> ``("a", "b")``; one or two names."""
    if isinstance(text_columns, (str, int)):
        text_columns = str(text_columns).split(",")
    columns = tuple(str(c).strip() for c in text_columns)
    if not 1 <= len(columns) <= 2 or not all(columns):
        raise ValueError(
            f"text_columns must name one column or two (a sentence pair), got {text_columns!r}."
        )
    return columns


def _is_missing(value) -> bool:
    """``None``, a blank string or NaN."""
    blank = isinstance(value, str) and not value.strip()
    return value is None or blank or (isinstance(value, float) and math.isnan(value))


class SampleEncoder:
    """One text, or a pair, as the model input of a :class:`TextClassificationDataset` sample.

    ``encoder(text)`` / ``encoder(text_a, text_b)`` gives ``{"input_ids", "attention_mask",
    "tokentype_ids"}`` (``torch.long``, ``[max_seq_length]``): framed by the tokenizer's own
    ``tokenizers`` pipeline, cut longest-first to ``max_seq_length`` and right-padded with
    the pad id. The dataset encodes its rows with it; use it on new texts (inference) to get
    exactly the training encoding.

    Args:
        tokenizer: a libai tokenizer built on the ``tokenizers`` library; it is left untouched
            (the encoder truncates and pads a private copy of its pipeline).
        max_seq_length: length of every encoding.
        pair: whether the encodings are of text pairs (two texts per call).
    """

    def __init__(self, tokenizer, max_seq_length: int, pair: bool = False):
        backend = getattr(tokenizer, "_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            name = type(tokenizer).__name__
            raise ValueError(
                f"text classification needs a libai tokenizer built on the `tokenizers` "
                f"library (BertTokenizer, RobertaTokenizer, JsonTokenizer), got {name}."
            )
        self.max_seq_length, self.pair = int(max_seq_length), bool(pair)
        backend = Tokenizer.from_str(backend.to_str())  # truncation/padding stay ours alone
        special = backend.num_special_tokens_to_add(is_pair=self.pair)
        if self.max_seq_length <= special:
            raise ValueError(
                f"max_seq_length must exceed the {special} special tokens the tokenizer adds, "
                f"got {self.max_seq_length}."
            )
        # no pad role: the tokenizer.json's own padding settings, else id 0 (masked out anyway)
        pad = {"pad_id": 0, "pad_token": "[PAD]", **(backend.padding or {})}
        if tokenizer.pad_token_id is not None:
            pad.update(pad_id=int(tokenizer.pad_token_id), pad_token=tokenizer.pad_token)
        backend.enable_truncation(self.max_seq_length, strategy="longest_first")
        backend.enable_padding(
            length=self.max_seq_length, pad_id=pad["pad_id"], pad_token=pad["pad_token"]
        )
        self._backend = backend

    def __call__(self, *texts: str) -> dict[str, torch.Tensor]:
        if len(texts) != 1 + self.pair:
            want = "two texts (a pair)" if self.pair else "one text"
            raise ValueError(f"this encoder takes {want}, got {len(texts)}: {texts!r}")
        encoding = self._backend.encode(*texts, add_special_tokens=True)
        return {
            "input_ids": torch.tensor(encoding.ids, dtype=torch.long),
            "attention_mask": torch.tensor(encoding.attention_mask, dtype=torch.long),
            "tokentype_ids": torch.tensor(encoding.type_ids, dtype=torch.long),
        }


class TextClassificationDataset(torch.utils.data.Dataset):
    """Map-style dataset of tokenized sentences (or pairs) with their labels.

    Args:
        data_path: the ``.csv``, ``.tsv``, ``.json`` or ``.jsonl`` file.
        tokenizer: a libai tokenizer built on the ``tokenizers`` library (``BertTokenizer``,
            ``RobertaTokenizer``, ``JsonTokenizer``, ``PretrainedJsonTokenizer``, ...).
        text_columns: the text column, or two for pairs; ``"sentence1,sentence2"`` works too.
            Without a header, columns are named by position: ``"0"``, ``"1"``, ...
        label_column: the label column.
        max_seq_length: length of every sample (truncated longest-first, then padded).
        label_map: ``None`` infers it: integer labels are used as they are (``num_labels`` =
            max + 1); numbers that are not all integers are regression targets (float,
            ``num_labels`` = 1); otherwise the distinct strings get ids in sorted order. A dict
            label -> id or a list of labels (index = id) maps them explicitly.
        file_format: ``"csv"``, ``"tsv"`` or ``"json"``; ``None`` = from the extension.
        has_header: whether the first CSV / TSV row names the columns.

    ``dataset[i]`` is ``{"input_ids", "attention_mask", "tokentype_ids"}`` (``torch.long``,
    ``[max_seq_length]``) and ``"labels"`` (a ``long`` scalar, ``float`` for regression).
    ``label_map`` (label string -> id, or ``None``) and ``num_labels`` are attributes, and
    ``encoder`` (a :class:`SampleEncoder`) encodes new texts the same way. Rows are read and
    checked when the dataset is built and tokenized when read.

    Raises:
        FileNotFoundError: ``data_path`` does not exist.
        ValueError: unknown format, no rows, a missing column (listing those found), an empty
            text cell or an unusable label (naming the file, row and column).
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        text_columns=("sentence",),
        label_column="label",
        max_seq_length: int = 128,
        label_map=None,
        file_format: str | None = None,
        has_header: bool = True,
    ):
        self.data_path = os.fspath(data_path)
        if not os.path.isfile(self.data_path):
            raise FileNotFoundError(f"text classification data file not found: {self.data_path}")
        ext = os.path.splitext(self.data_path)[1].lower()
        self.file_format = file_format or _FORMATS.get(ext)
        if self.file_format not in ("csv", "tsv", "json"):
            raise ValueError(
                f"{self.data_path}: unknown data format {file_format or ext!r}; use a .csv, .tsv, "
                ".json or .jsonl file, or set file_format to 'csv', 'tsv' or 'json'."
            )
        self.text_columns = _columns(text_columns)
        self.label_column = str(label_column)
        self.max_seq_length = int(max_seq_length)
        self.has_header, self.tokenizer = bool(has_header), tokenizer
        #: encodes one row's texts into a sample (also usable on new texts, for inference)
        self.encoder = SampleEncoder(tokenizer, self.max_seq_length, len(self.text_columns) == 2)
        rows = list(self._read_rows())
        if not rows:
            raise ValueError(f"{self.data_path} is empty: it holds no data rows.")
        #: the text (or the two texts) of each row
        self.texts = [texts for texts, _, _ in rows]
        #: label id (``int``) or regression target (``float``) of each row
        self.labels = self._map_labels([(label, where) for _, label, where in rows], label_map)

    # ---- reading ------------------------------------------------------------------------------
    def _read_rows(self):
        """``(texts, raw label, where)`` of every row, checked."""
        records = self._read_json() if self.file_format == "json" else self._read_table()
        for where, record in records:
            for column in (*self.text_columns, self.label_column):
                if column not in record:
                    raise ValueError(
                        f"{where}: no column {column!r}; the columns found are {sorted(record)}."
                    )
            texts = [record[column] for column in self.text_columns]
            for column, value in zip(self.text_columns, texts):
                if _is_missing(value) or isinstance(value, (dict, list)):
                    raise ValueError(f"{where}, column {column!r}: empty or no text ({value!r}).")
            yield [str(t) for t in texts], record[self.label_column], where

    def _read_table(self):
        tsv = self.file_format == "tsv"
        with open(self.data_path, encoding="utf-8-sig", newline="") as f:
            # GLUE's TSVs hold unbalanced quotes: no quoting at all
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
            header, row_number = None, 0
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if header is None and self.has_header:
                    header = [cell.strip() for cell in row]
                    continue
                if header is None:
                    header = [str(i) for i in range(len(row))]
                row_number += 1
                where = f"{self.data_path}, row {row_number} (line {reader.line_num})"
                if len(row) != len(header):
                    raise ValueError(
                        f"{where}: {len(row)} fields, but the header has {len(header)} ({header})."
                    )
                yield where, dict(zip(header, row))

    def _read_json(self):
        with open(self.data_path, encoding="utf-8-sig") as f:
            text = f.read()
        if text.lstrip().startswith("["):  # one JSON array of objects
            data = _loads(text, self.data_path)
            records = [(f"{self.data_path}, record {i}", r) for i, r in enumerate(data, 1)]
        else:  # JSON lines
            lines = enumerate(text.splitlines(), start=1)
            wheres = [(f"{self.data_path}, line {n}", line) for n, line in lines if line.strip()]
            records = [(where, _loads(line, where)) for where, line in wheres]
        for where, record in records:
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}.")
            yield where, record

    # ---- labels -------------------------------------------------------------------------------
    def _map_labels(self, labels, label_map) -> list:
        def bad(where, value, why):
            return ValueError(f"{where}, column {self.label_column!r}: label {value!r} {why}.")

        for value, where in labels:
            if _is_missing(value) or isinstance(value, (bool, dict, list)):
                raise bad(where, value, "is empty or not a string or number")
        self.label_map = None
        if label_map is not None:  # explicit: label (as a string) -> id
            self.label_map = _explicit_map(label_map)
            self.num_labels = max(self.label_map.values()) + 1
            for value, where in labels:
                if str(value).strip() not in self.label_map:
                    raise bad(where, value, f"is not in label_map {sorted(self.label_map)}")
            return [self.label_map[str(v).strip()] for v, _ in labels]
        numbers = [_number(v) for v, _ in labels]
        numeric = [x is not None for x in numbers]
        if any(numeric) and not all(numeric):  # most likely a typo in a numeric column
            (value, where), (first, at) = labels[numeric.index(False)], labels[numeric.index(True)]
            why = f"is not a number like {first!r} ({at}); give a label_map to use text labels"
            raise bad(where, value, why)
        if all(isinstance(x, int) for x in numbers):  # class ids as they are
            for x, (value, where) in zip(numbers, labels):
                if x < 0:
                    raise bad(where, value, "is negative; class labels are ids 0, 1, ...")
            self.num_labels = max(numbers) + 1
            return numbers
        if all(numeric):  # regression targets
            self.num_labels = 1
            return [float(x) for x in numbers]
        names = sorted({str(v).strip() for v, _ in labels})
        self.label_map = {name: i for i, name in enumerate(names)}
        self.num_labels = len(names)
        return [self.label_map[str(v).strip()] for v, _ in labels]

    # ---- samples ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        label = self.labels[idx]
        dtype = torch.float32 if isinstance(label, float) else torch.long
        return {**self.encoder(*self.texts[idx]), "labels": torch.tensor(label, dtype=dtype)}


def _explicit_map(label_map) -> dict[str, int]:
    """A dict label -> id, or a list of labels (index = id), as ``{str(label): id}``."""
    if isinstance(label_map, Sequence) and not isinstance(label_map, str):
        label_map = {name: i for i, name in enumerate(label_map)}
    try:
        mapping = {str(k): int(v) for k, v in label_map.items()}
    except (AttributeError, TypeError, ValueError):
        mapping = {}
    if not mapping or min(mapping.values()) < 0:
        raise ValueError(
            f"label_map must be a dict label -> id >= 0, or a list of labels; got {label_map!r}."
        )
    return mapping


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e}).") from None


def _number(value) -> int | float | None:
    """``value`` as an int (``3``, ``"3"``), a finite float (``"3.5"``) or ``None``."""
    if not isinstance(value, (int, float)):
        for parse in (int, float):
            try:
                value = parse(str(value).strip())
                break
            except ValueError:
                pass
        else:
            return None
    return value if isinstance(value, int) or math.isfinite(value) else None
