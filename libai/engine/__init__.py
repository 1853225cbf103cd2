"""How a model is parallelized and run (the trainer builds on this)."""

from libai.engine.parallel import PIPELINE_SCHEDULES, ModelRunner, prune_to_stages, train_step

__all__ = ["PIPELINE_SCHEDULES", "ModelRunner", "prune_to_stages", "train_step"]
