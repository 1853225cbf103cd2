"""Runs the model over one scheduled step, on every rank of the layout.

The scheduler lives on rank 0. Each step it hands a :class:`StepPlan` (the packed token
ids, their positions, each sequence's start, count and block table, and which packed
tokens need logits) to :meth:`ModelExecutor.execute`; with more than one rank the plan is
broadcast first and every rank runs the same forward (tensor parallel: each rank its heads,
its pools and its share of the vocabulary, gathered into full logits; pipeline parallel:
each stage its layers, the hidden states handed on, the last stage's logits sent back to
the first). Ranks other than 0
sit in :meth:`ModelExecutor.serve` until rank 0 sends ``None``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from libai.inference.stage_comm import StagePipe
from libai.layers.paged_kv_cache import PagedKVCache, PagedStep
from libai.models.lora_adapters import adapter_routing


@dataclass
class StepPlan:
    token_ids: list[int]
    positions: list[int]
    starts: list[int]
    counts: list[int]
    tables: list[list[int]]
    #: packed indices of the tokens whose next-token logits are needed
    logits_at: list[int]
    #: each sequence's adapter (an index of the model's adapters; -1: the base alone)
    adapters: list[int] | None = None


class ModelExecutor:
    """The model, its paged cache and the ranks that step together."""

    def __init__(self, model, cache: PagedKVCache, device, pipe: StagePipe | None = None):
        if not hasattr(model, "decode_stage") or hasattr(model, "encode_stage"):
            raise TypeError(
                f"{type(model).__name__} cannot be served: the server runs decoder-only "
                "models (GPT-2, Llama, Qwen, Mistral, Mixtral, ...)"
            )
        self.model, self.cache, self.device = model, cache, torch.device(device)
        self.pipe = pipe or StagePipe()
        self.world_size = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
        #: the model's per-request adapters (:func:`~libai.models.lora_adapters.load_peft_adapters`)
        self.adapters = adapter_routing(model)

    @property
    def adapter_names(self) -> list[str]:
        return [] if self.adapters is None else list(self.adapters.names)

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Rank 0: the logits ``[len(plan.logits_at), vocab]`` (float32) of the step."""
        if self.world_size > 1:
            torch_dist.broadcast_object_list([plan], src=0)
        return self._forward(plan)

    @torch.no_grad()
    def serve(self) -> None:
        """Ranks > 0: run every plan rank 0 broadcasts, until it broadcasts None."""
        while True:
            box = [None]
            torch_dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                return
            self._forward(box[0])

    def stop_workers(self) -> None:
        if self.world_size > 1:
            torch_dist.broadcast_object_list([None], src=0)

    def _forward(self, plan: StepPlan) -> torch.Tensor:
        as_long = dict(dtype=torch.long, device=self.device)
        self.cache.step = PagedStep(
            plan.starts, plan.counts, plan.tables, self.cache.block_size, self.device
        )
        ids = torch.tensor([plan.token_ids], **as_long)
        positions = torch.tensor([plan.positions], **as_long)
        logits_at = torch.tensor(plan.logits_at, **as_long)

        def stage(x):  # [1, N] ids (hidden states after the first stage) -> next stage
            return self.model.decode_stage(x, None, positions, self.cache, logits_at=logits_at)

        with self._routed(plan):
            logits = self.pipe.run(stage, ids)  # the last stage's [1, K, vocab]
        self.cache.step = None
        if self.pipe.num_stages > 1:  # to the scheduler's rank (first stage)
            (logits,) = self.pipe.broadcast_from_last((logits,))
        return logits[0].float()

    def _routed(self, plan: StepPlan):
        """Each packed token through its sequence's adapter (a no-op without adapters)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        per_seq = plan.adapters or [-1] * len(plan.counts)
        slots = torch.repeat_interleave(
            torch.tensor(per_seq, dtype=torch.long), torch.tensor(plan.counts, dtype=torch.long)
        )
        return self.adapters.route(slots.to(self.device))
