"""How a model is parallelized and run: ModelRunner, the trainer, its hooks."""

from libai.engine.default import DefaultTrainer, default_argument_parser, default_setup
from libai.engine.parallel import PIPELINE_SCHEDULES, ModelRunner, prune_to_stages, train_step
from libai.engine.trainer import EagerTrainer, HookBase, TrainerBase

__all__ = [
    "PIPELINE_SCHEDULES",
    "DefaultTrainer",
    "EagerTrainer",
    "HookBase",
    "ModelRunner",
    "TrainerBase",
    "default_argument_parser",
    "default_setup",
    "prune_to_stages",
    "train_step",
]
