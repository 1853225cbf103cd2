"""SimCSE's data: unsupervised sentences, supervised NLI triples, STS evaluation pairs.

Every sentence is encoded on its own by the tokenizer's ``tokenizers`` pipeline (BERT:
``[CLS] tokens [SEP]``), cut to ``max_seq_length`` and right-padded to it. Samples:

* :class:`UnsupervisedDataset` (a text file, one sentence per line):
  ``{"input_ids", "attention_mask"}`` of ``[max_seq_length]``;
* :class:`SupervisedDataset` (CSV ``sent0,sent1,hard_neg``): ``[3, max_seq_length]`` each;
* :class:`STSDataset` (CSV ``sentence1,sentence2,score``): ``[2, max_seq_length]`` each and
  ``"labels"``, the gold score (float).

A ``.tsv`` file is read tab-separated without quoting (GLUE's STS-B ``dev.tsv`` works as it
is); both need a header row naming the columns.
"""

from __future__ import annotations

import csv
import math
import os

import torch
from tokenizers import Tokenizer


class SentenceEncoder:
    """Fixed-length encoding of single sentences with a libai tokenizer.

    Args:
        tokenizer: a libai tokenizer built on the ``tokenizers`` library (``BertTokenizer``,
            ``RobertaTokenizer``, ``JsonTokenizer``).
        max_seq_length: tokens per sentence, special tokens included.
    """

    def __init__(self, tokenizer, max_seq_length: int):
        pipeline = getattr(tokenizer, "_tokenizer", None)
        if not isinstance(pipeline, Tokenizer):
            raise ValueError(
                "SimCSE datasets need a libai tokenizer built on the `tokenizers` library "
                f"(BertTokenizer, RobertaTokenizer, JsonTokenizer), got {type(tokenizer).__name__}."
            )
        # a private copy: truncation and padding settings stay out of the shared tokenizer
        self._tokenizer = Tokenizer.from_str(pipeline.to_str())
        specials = self._tokenizer.num_special_tokens_to_add(is_pair=False)
        if int(max_seq_length) <= specials:
            raise ValueError(
                f"max_seq_length must exceed the {specials} special tokens of a sentence, "
                f"got {max_seq_length}."
            )
        self.max_seq_length = int(max_seq_length)
        pad_id = tokenizer.pad_token_id
        pad_id = 0 if pad_id is None else int(pad_id)
        pad_token = tokenizer.pad_token or self._tokenizer.id_to_token(pad_id) or "[PAD]"
        self._tokenizer.enable_truncation(self.max_seq_length)
        self._tokenizer.enable_padding(
            length=self.max_seq_length, pad_id=pad_id, pad_token=pad_token
        )

    def __call__(self, sentences: list[str]) -> dict[str, torch.Tensor]:
        """``{"input_ids", "attention_mask"}`` of ``[len(sentences), max_seq_length]``."""
        encodings = self._tokenizer.encode_batch(list(sentences), add_special_tokens=True)
        return {
            "input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),
        }


def _check_file(path, what: str, key: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SimCSE {what} file not found: {path!r}; set {key} to it.")
    return path


def read_table(path: str, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The ``columns`` of every row of a CSV (``.tsv``: tab-separated) file with a header.

    Raises ``ValueError`` naming the file (and row) for a missing column, a row of the wrong
    width, an empty cell, or a file without data rows.
    """
    tsv = path.lower().endswith(".tsv")
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        # GLUE's TSVs (STS-B) hold unbalanced quotes: no quoting in TSV
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
        header = next(reader, None)
        header = [h.strip() for h in header] if header else []
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(
                f"{path}: no column {missing[0]!r} in the header row {header}; this file needs "
                f"a header with the columns {list(columns)}."
            )
        index = [header.index(c) for c in columns]
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            where = f"{path}, line {reader.line_num}"
            if len(row) != len(header):
                raise ValueError(f"{where}: {len(row)} fields, but the header has {len(header)}.")
            cells = tuple(row[i].strip() for i in index)
            for column, cell in zip(columns, cells):
                if not cell:
                    raise ValueError(f"{where}: column {column!r} is empty.")
            rows.append(cells)
    if not rows:
        raise ValueError(f"{path} holds no data rows (only a header, or nothing).")
    return rows


class UnsupervisedDataset(torch.utils.data.Dataset):
    """Unsupervised SimCSE: one sentence per line of a UTF-8 text file (blank lines skipped).

    Args:
        data_path: the text file.
        tokenizer: see :class:`SentenceEncoder`.
        max_seq_length: tokens per sentence (SimCSE: 32).
    """

    def __init__(self, data_path, tokenizer, max_seq_length: int = 32):
        self.data_path = _check_file(
            data_path, "training text", "dataloader.train.dataset.0.data_path"
        )
        with open(self.data_path, encoding="utf-8") as f:
            self.sentences = [line.strip() for line in f if line.strip()]
        if not self.sentences:
            raise ValueError(f"{self.data_path} holds no sentences (one per line expected).")
        self.encoder = SentenceEncoder(tokenizer, max_seq_length)

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        encoded = self.encoder([self.sentences[idx]])
        return {key: value[0] for key, value in encoded.items()}


class SupervisedDataset(torch.utils.data.Dataset):
    """Supervised SimCSE: NLI triples (premise, entailment, contradiction) from a CSV file.

    Args:
        data_path: CSV / TSV with a header naming ``columns``.
        tokenizer: see :class:`SentenceEncoder`.
        max_seq_length: tokens per sentence.
        columns: anchor, positive and (optionally) hard-negative columns; two names train on
            positive pairs only.
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        max_seq_length: int = 32,
        columns=("sent0", "sent1", "hard_neg"),
    ):
        self.columns = tuple(str(c) for c in columns)
        if len(self.columns) not in (2, 3):
            raise ValueError(
                "SupervisedDataset columns must name 2 (anchor, positive) or 3 (anchor, "
                f"positive, hard negative) columns, got {list(self.columns)}."
            )
        self.data_path = _check_file(
            data_path, "NLI training", "dataloader.train.dataset.0.data_path"
        )
        self.rows = read_table(self.data_path, self.columns)
        self.encoder = SentenceEncoder(tokenizer, max_seq_length)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return self.encoder(self.rows[idx])


class STSDataset(torch.utils.data.Dataset):
    """Semantic textual similarity pairs with gold scores (STS-B style) for evaluation.

    Args:
        data_path: CSV / TSV with a header naming ``columns``.
        tokenizer: see :class:`SentenceEncoder`.
        max_seq_length: tokens per sentence.
        columns: the two sentence columns and the score column.
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        max_seq_length: int = 32,
        columns=("sentence1", "sentence2", "score"),
    ):
        self.columns = tuple(str(c) for c in columns)
        if len(self.columns) != 3:
            raise ValueError(
                f"STSDataset columns must be (sentence1, sentence2, score), got {list(columns)}."
            )
        self.data_path = _check_file(
            data_path, "STS evaluation", "dataloader.train.valid_dataset.data_path"
        )
        rows = read_table(self.data_path, self.columns)
        self.pairs = [(a, b) for a, b, _ in rows]
        self.scores = [self._score(score, i) for i, (_, _, score) in enumerate(rows, 1)]
        self.encoder = SentenceEncoder(tokenizer, max_seq_length)

    def _score(self, value: str, row: int) -> float:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise ValueError(
                f"{self.data_path}, data row {row}: score {value!r} in column "
                f"{self.columns[2]!r} is not a finite number."
            )
        return score

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        sample = self.encoder(self.pairs[idx])
        sample["labels"] = torch.tensor(self.scores[idx], dtype=torch.float32)
        return sample
