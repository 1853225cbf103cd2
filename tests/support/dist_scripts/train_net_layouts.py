"""tools/train_net.py's own ``main`` on configs/gpt2_pretrain.py (the tiny GPT of
train_net_helpers.TINY) under several override sets, one after another in these ranks. Per
run: what this rank holds (door_memory.holdings: optimizer state, gradients when the
optimizer steps, parameters), read by a hook added to the trainer's own hooks; the losses
and perplexity are in each run's metrics.json."""

from __future__ import annotations

import importlib.util
import json

from common import parse_out_dir, run_checks
from door_memory import holdings, probe_step
from train_net_helpers import ROOT, TINY

from libai.engine import DefaultTrainer, default_argument_parser
from libai.runtime.trainer import HookBase

CONFIG = ROOT / "configs" / "gpt2_pretrain.py"


def load_train_net():
    spec = importlib.util.spec_from_file_location("train_net_tool", ROOT / "tools" / "train_net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HoldingsProbe(HookBase):
    """Records :func:`door_memory.holdings` of the trainer it is registered on."""

    found: dict = {}

    def before_train(self):
        self.record = probe_step(self.trainer.optimizer, self.trainer.runner.model)

    def after_train(self):
        trainer = self.trainer
        HoldingsProbe.found = holdings(trainer.optimizer, trainer.runner.model, self.record)


def main():
    out_dir, _, rest = parse_out_dir()
    runs = json.loads(rest[0])
    train_net = load_train_net()
    build_hooks = DefaultTrainer.build_hooks
    DefaultTrainer.build_hooks = lambda self: [*build_hooks(self), HoldingsProbe()]

    def checks():
        results = {}
        for name, opts in runs.items():
            parser = default_argument_parser()
            args = parser.parse_args(["--config-file", str(CONFIG), *TINY, *opts])
            assert train_net.main(args) == 0
            results[name] = HoldingsProbe.found
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
