"""The execution core every front door drives: how a model is parallelized and run.

``parallelize`` (the transforms, in their order), ``parallel`` (ModelRunner: one step),
``pipeline_split`` / ``pipeline_schedule`` / ``pipeline_stages`` (pipeline parallel),
``context_parallel``, ``grad_sync`` / ``grad_overlap`` / ``grad_clip`` / ``sequence_parallel``,
``blocks`` (checkpointing and compile), ``zero`` / ``fsdp`` (ZeRO 1-3), ``forward_only``
(evaluation passes), ``amp`` / ``amp_lists`` (mixed precision), ``trainer`` / ``hooks`` (the
loop), ``core`` (building the runner, optimizer wrapping, checkpointer and hooks from the
``train`` settings), ``run`` (:class:`~libai.runtime.run.Run`, the one run builder every
door uses: parallelize, optimizer, ZeRO, LR schedule, checkpointer, resume, loop) and
``memory_estimator``. The doors (``libai.engine`` for LiBai,
FleetX's Engine, ``libai.accelerate``) translate their own syntax into these; nothing here
imports a door.
"""

#: the modules of the runtime (``libai.engine.<name>`` stays an alias of each)
MODULES = (
    "amp",
    "amp_lists",
    "blocks",
    "core",
    "fsdp",
    "grad_clip",
    "grad_overlap",
    "hooks",
    "memory_estimator",
    "parallel",
    "pipeline_stages",
    "sequence_parallel",
    "trainer",
    "zero",
)
