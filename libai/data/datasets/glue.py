"""GLUE tasks from local files, by FleetX's dataset names (``Data.*.dataset.name: SST2``
with ``root``, ``split``, ``max_length``): CoLA, SST2, MNLI, QNLI, RTE, WNLI, MRPC, QQP,
STSB.

Each task reads the tab-separated file GLUE's archive holds for the split (nothing is
downloaded: ``root`` must hold it), skipping the header line, with the columns and label
names FleetX's ``glue_dataset.py`` uses. A sample is ``{"input_ids": [max_length],
"labels": label}`` (``test`` splits without labels where GLUE has none): the text, or the
pair of texts concatenated, tokenized with the task module's tokenizer, truncated
longest-first and right-padded with its eos token to ``max_length``.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import torch

__all__ = ["GLUE_TASKS", "GlueDataset", "glue_dataset_class"]


@dataclass(frozen=True)
class GlueTask:
    """Where a task's split lives and which columns hold its texts and label."""

    files: dict[str, str]
    texts: tuple[int, ...]
    label: int | None
    labels: dict[str, int] | None = None  # label names -> ids (None: the column is a number)
    test_texts: tuple[int, ...] | None = None  # the test file's text columns, when unlabeled
    num_classes: int = 2
    regression: bool = False
    min_columns: int = 0


_TSV = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_ENTAIL = {"entailment": 0, "not_entailment": 1}
GLUE_TASKS = {
    "CoLA": GlueTask(
        {
            "train": os.path.join("raw", "in_domain_train.tsv"),
            "dev": os.path.join("raw", "in_domain_dev.tsv"),
            "test": os.path.join("raw", "out_of_domain_dev.tsv"),
        },
        texts=(3,),
        label=1,
        min_columns=4,
    ),
    "SST2": GlueTask(_TSV, texts=(0,), label=1, test_texts=(1,)),
    "MNLI": GlueTask(
        {
            "train": "multinli_1.0_train.txt",
            "dev_matched": "multinli_1.0_dev_matched.txt",
            "dev_mismatched": "multinli_1.0_dev_mismatched.txt",
        },
        texts=(5, 6),
        label=0,
        labels={"entailment": 0, "neutral": 1, "contradiction": 2},
        num_classes=3,
    ),
    "QNLI": GlueTask(_TSV, texts=(1, 2), label=3, labels=_ENTAIL, test_texts=(1, 2)),
    "RTE": GlueTask(_TSV, texts=(1, 2), label=3, labels=_ENTAIL, test_texts=(1, 2)),
    "WNLI": GlueTask(_TSV, texts=(1, 2), label=3, test_texts=(1, 2)),
    "MRPC": GlueTask(
        {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"},
        texts=(3, 4),
        label=0,
    ),
    "QQP": GlueTask(_TSV, texts=(3, 4), label=5, test_texts=(1, 2)),
    "STSB": GlueTask(_TSV, texts=(7, 8), label=9, test_texts=(7, 8), regression=True),
}


def _truncate(a: list[int], b: list[int] | None, max_length: int) -> list[int]:
    """``a`` (+ ``b``) cut to ``max_length`` tokens, one token at a time from the longer."""
    if b is None:
        return a[:max_length]
    a, b = list(a), list(b)
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
    return a + b


class GlueDataset(torch.utils.data.Dataset):
    """One split of the GLUE task ``task`` under ``root`` (see the module doc)."""

    task_name: str = ""

    def __init__(self, root: str, split: str, max_length: int = 128, tokenizer=None):
        task = GLUE_TASKS[self.task_name]
        if split not in task.files:
            raise ValueError(
                f"{self.task_name}: split must be one of {sorted(task.files)}, got {split!r}"
            )
        if tokenizer is None:
            raise ValueError(f"{self.task_name} needs the task module's tokenizer")
        self.path = os.path.join(str(root), task.files[split])
        if not os.path.isfile(self.path):
            raise FileNotFoundError(
                f"{self.task_name}: {self.path} does not exist; put GLUE's {self.task_name} "
                f"files under root={root} (nothing is downloaded)"
            )
        unlabeled = split == "test" and task.test_texts is not None
        columns = task.test_texts if unlabeled else task.texts
        label_col = None if unlabeled else task.label
        self.max_length, self.tokenizer = int(max_length), tokenizer
        self.pad = tokenizer.eos_token_id
        self.num_classes = task.num_classes
        self.samples = []
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            for index, row in enumerate(rows):
                if index == 0 or len(row) < task.min_columns:
                    continue  # the header line (FleetX skips it for every task)
                label = None
                if label_col is not None:
                    raw = row[label_col]
                    if task.labels is not None:
                        if raw not in task.labels:
                            continue
                        label = task.labels[raw]
                    else:
                        label = float(raw) if task.regression else int(raw)
                self.samples.append(([row[c].strip() for c in columns], label))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        texts, label = self.samples[idx]
        ids = [list(self.tokenizer.encode(t)) for t in texts]
        tokens = _truncate(ids[0], ids[1] if len(ids) > 1 else None, self.max_length)
        tokens += [self.pad] * (self.max_length - len(tokens))
        sample = {"input_ids": torch.tensor(tokens, dtype=torch.long)}
        if label is not None:
            dtype = torch.float32 if isinstance(label, float) else torch.long
            sample["labels"] = torch.tensor(label, dtype=dtype)
        return sample


def glue_dataset_class(name: str) -> type[GlueDataset]:
    """The dataset class of GLUE task ``name`` (FleetX's name, e.g. ``SST2``)."""
    return type(name, (GlueDataset,), {"task_name": name, "__doc__": GlueDataset.__doc__})


for _name in GLUE_TASKS:
    globals()[_name] = glue_dataset_class(_name)
__all__ += list(GLUE_TASKS)
