"""FleetX's front door: a task ``BasicModule`` + ``Engine`` driven by a FleetX YAML
(``yaml_config``: loading and merging; ``yaml_setup``: the YAML translated into the
runtime's ``train`` settings; ``yaml_optim`` / ``yaml_loaders``: FleetX's optimizer,
schedule and data-loader names; ``export``; the zoo's task ``modules``), on the execution
core in :mod:`libai.runtime`. ``tools/train.py`` / ``eval.py`` / ``export.py`` run it."""

from libai.fleetx.engine import Engine
from libai.fleetx.module import BasicModule, InputSpec

__all__ = ["BasicModule", "Engine", "InputSpec"]
