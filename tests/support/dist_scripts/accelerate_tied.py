"""libai.accelerate on 2 ranks with a tied Hugging Face model (BertForPreTraining: the MLM
head's decoder is the word embedding): ``--fsdp-memory-optimization`` against plain data
parallel, through compose (each step's loss, every gradient after the dp sync, what each
rank holds) and through the black box (``cli``: per-step losses in metrics.json)."""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks

from libai import dist

STEPS = 2


def _bert(config: dict):
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.BertForPreTraining(transformers.BertConfig(**config))


def _batch(step: int, vocab: int, rank: int, dp: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    ids = torch.randint(5, vocab, (8, 16), generator=g)
    labels = torch.where(torch.rand(8, 16, generator=g) < 0.3, ids, -100)
    batch = {
        "input_ids": ids,
        "token_type_ids": (torch.arange(16) >= 8).long().expand(8, 16),
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (8,), generator=g),
    }
    return {k: v.chunk(dp)[rank] for k, v in batch.items()}


def compose_run(argv: list[str], config: dict) -> dict:
    """Losses, full gradients (name -> list) at the first step, and local parameter
    elements of this rank."""
    from torch.distributed.tensor import DTensor

    from libai.accelerate import AccelerateEngine

    engine = AccelerateEngine(argv)
    model, optimizer, _ = engine.compose(_bert(config), train_iters=STEPS)
    runner_model = engine.runner.model
    grads: dict = {}
    inner = optimizer.optimizer.step

    def step(*args, **kwargs):  # after the dp sync / FSDP's reduce-scatter
        if not grads:
            for name, p in runner_model.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[name] = g.flatten().tolist()
        return inner(*args, **kwargs)

    optimizer.optimizer.step = step
    dp, rank = dist.get_data_parallel_size(), dist.get_data_parallel_rank()
    losses = []
    for s in range(STEPS):
        loss = model(**_batch(s, config["vocab_size"], rank, dp)).loss
        engine.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    local = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() for p in runner_model.parameters()
    )
    bert = runner_model
    tied = bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    sharded = isinstance(bert.bert.embeddings.word_embeddings.weight, DTensor)
    return {
        "losses": losses,
        "grads": grads,
        "local_numel": local,
        "tied": tied,
        "sharded": sharded,
    }


def main():
    out_dir, _, rest = parse_out_dir()
    spec = json.loads(rest[0])

    def checks():
        from libai.accelerate.cli import main as cli_main

        results = {}
        for name, flags in spec["compose"].items():
            results[name] = compose_run(spec["compose_argv"] + flags, spec["config"])
            dist.synchronize()
        for name, argv in spec["cli"].items():
            results[name] = {"code": cli_main(argv)}
            dist.synchronize()
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
