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


def compose_and_train(argv: list[str], model_dir, steps: int = 6) -> dict:
    """Rapidformer's compose API on this rank's mesh: a DistilBERT classifier (its files: dropout off)
    trained ``steps`` steps, each on its own global batch of 8 split over the dp ranks.
    Returns this rank's loss of every step and what it holds (door_memory.holdings, the
    gradients read when the optimizer's inner step runs, after the dp sync)."""
    import torch
    import transformers
    from door_memory import holdings, probe_step

    from libai import dist
    from libai.accelerate import AccelerateEngine

    engine = AccelerateEngine(argv)
    torch.manual_seed(0)  # the classifier head is new: the same draw on every rank and run
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    model, optimizer, _ = engine.compose(model, train_iters=steps)
    # the user calls the wrapper's step; it syncs the gradients, then steps the inner one
    record = probe_step(optimizer.optimizer, model)
    dp, rank = dist.get_data_parallel_size(), dist.get_data_parallel_rank()
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        batch = {
            "input_ids": torch.randint(5, 50, (8, 16), generator=g),
            "labels": torch.randint(0, 2, (8,), generator=g),
        }
        batch = {k: v.chunk(dp)[rank] for k, v in batch.items()}
        loss = model(**batch).loss
        engine.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {"losses": losses, **holdings(optimizer.optimizer, model, record)}
