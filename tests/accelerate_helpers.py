"""Command lines of libai.accelerate's tests: one per task on the tiny local files of
``accelerate_data`` (see the ``accelerate_files`` fixture)."""

from __future__ import annotations

#: task -> (model directory, data files key, extra flags)
TASKS = {
    "sequence_classification": ("distilbert", "cls", ["--text-columns", "sentence1,sentence2"]),
    "token_classification": ("distilbert", "ner", []),
    "question_answering": ("distilbert", "qa", []),
    "masked_lm": ("roberta", "text", []),
    "causal_lm": ("gpt2", "text", []),
    "seq2seq_lm": ("t5", "s2s", []),
    "pretraining": ("gpt2", "pretrain", ["--eval-iters", "2"]),
}
#: the metric each task reports
METRICS = {
    "sequence_classification": "accuracy",
    "token_classification": "f1",
    "question_answering": "exact_match",
    "masked_lm": "perplexity",
    "causal_lm": "perplexity",
    "seq2seq_lm": "perplexity",
    "pretraining": "perplexity",
}
COMMON = [
    "--seq-length",
    "32",
    "--lr",
    "3e-3",
    "--lr-decay-style",
    "constant",
    "--log-interval",
    "1",
]


def task_argv(files, task, save, *extra, model=None, steps=12, micro=8) -> list[str]:
    """The black box's flags for ``task`` on the tiny files, ``steps`` steps, saving to ``save``."""
    model_key, data_key, flags = TASKS[task]
    data = files[data_key]
    argv = ["--task", task, "--pretrained-model-name-or-path", str(files[model or model_key])]
    if task == "pretraining":
        argv += ["--data-path", str(data)]
    else:
        argv += ["--data-path", str(data[0]), "--validation-path", str(data[1])]
    return [
        *argv,
        *flags,
        *COMMON,
        "--train-iters",
        str(steps),
        "--micro-batch-size",
        str(micro),
        "--save",
        str(save),
        *extra,
    ]
