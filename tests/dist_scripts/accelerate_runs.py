"""libai.accelerate on several ranks: black-box runs (``cli``) and per-rank memory of the
ZeRO switches (``zero``: compose a DistilBERT classifier, take one step, report this rank's
optimizer-state bytes, parameter elements and the gradient elements it still holds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import parse_out_dir, run_checks  # noqa: E402

from libai.utils import distributed as dist  # noqa: E402


def zero_memory(argv: list[str]) -> dict:
    import torch
    import transformers

    from libai.accelerate import AccelerateEngine
    from libai.engine.zero import optimizer_state_bytes

    engine = AccelerateEngine(argv)
    path = engine.args.pretrained_model_name_or_path
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    model, optimizer, _ = engine.compose(model, train_iters=4)
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(5, 50, (8, 16), generator=g),
        "labels": torch.randint(0, 2, (8,), generator=g),
    }

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    # the gradients this rank holds when its optimizer steps (after the dp sync: ZeRO-2 keeps
    # only the ones it owns); the runner clears them after the step
    held, inner_step = [], optimizer.optimizer.step

    def step(*args, **kwargs):
        held.append(sum(local(p.grad).numel() for p in model.parameters() if p.grad is not None))
        return inner_step(*args, **kwargs)

    optimizer.optimizer.step = step
    engine.backward(model(**batch).loss)
    optimizer.step()
    return {
        "state_bytes": optimizer_state_bytes(optimizer.optimizer),
        "param_numel": sum(local(p).numel() for p in model.parameters()),
        "grad_numel": held[0],
    }


def loader_ids(argv: list[str]) -> dict:
    """The sample ids of this rank's first 4 training batches (two epochs of a 24-sample
    set) and of its evaluation pass, through the engine's own loaders."""
    from libai.accelerate import AccelerateEngine

    engine = AccelerateEngine(argv)
    dataset = list(range(24))
    train = engine.build_data_loader(dataset, collate_fn=list, steps_per_epoch=2)
    batches = [batch for _ in range(2) for batch in train]
    evaluation = engine.build_data_loader(dataset[:10], train=False, collate_fn=list)
    return {"train": batches, "eval": [batch for batch in evaluation]}


def main():
    out_dir, _, rest = parse_out_dir()
    runs = json.loads(rest[0])

    def checks():
        from libai.accelerate.cli import main as cli_main

        results = {}
        for run in runs:
            if run["kind"] == "cli":
                results[run["name"]] = {"code": cli_main(run["argv"])}
            elif run["kind"] == "loaders":
                results[run["name"]] = loader_ids(run["argv"])
            else:
                results[run["name"]] = zero_memory(run["argv"])
            dist.synchronize()
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
