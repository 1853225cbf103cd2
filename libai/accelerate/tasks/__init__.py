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
(GLUE / SuperGLUE's, inferred from the columns), ``label_column`` (``"label"``; ``"ner_tags"`` for tokens),
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

from libai.accelerate.tasks.classification import SequenceClassification, TokenClassification
from libai.accelerate.tasks.common import (
    IGNORE_INDEX,
    MaskedLMDataset,
    Prepared,
    Task,
    TensorDictDataset,
    check_columns,
    iob2_spans,
)
from libai.accelerate.tasks.language_modeling import CausalLM, MaskedLM, PreTraining, Seq2SeqLM
from libai.accelerate.tasks.question_answering import QuestionAnswering

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
