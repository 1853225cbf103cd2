"""How a model is parallelized and run: ModelRunner, the training loop and its hooks, and the
two front doors on them: LiBai's ``DefaultTrainer`` and FleetX's ``Engine`` + ``BasicModule``."""

from libai.engine.default import DefaultTrainer, default_argument_parser, default_setup
from libai.engine.engine import Engine
from libai.engine.module import BasicModule, InputSpec
from libai.engine.parallel import PIPELINE_SCHEDULES, ModelRunner, prune_to_stages, train_step
from libai.engine.trainer import EagerTrainer, HookBase, TrainerBase

__all__ = [
    "PIPELINE_SCHEDULES",
    "BasicModule",
    "DefaultTrainer",
    "EagerTrainer",
    "Engine",
    "HookBase",
    "InputSpec",
    "ModelRunner",
    "TrainerBase",
    "default_argument_parser",
    "default_setup",
    "prune_to_stages",
    "train_step",
]
