"""libai.accelerate on several ranks: black-box runs (``cli``), the sample ids of the loaders
(``loaders``) and the ZeRO switches through compose (``zero``:
accelerate_helpers.compose_and_train, this rank's losses and what it holds)."""

from __future__ import annotations

import json

from accelerate_helpers import compose_and_train
from common import parse_out_dir, run_checks

from libai import dist


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
                results[run["name"]] = compose_and_train(run["argv"], run["model_dir"])
            dist.synchronize()
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
