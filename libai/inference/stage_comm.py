"""Hand activations from pipeline stage to pipeline stage for inference.

Training drives stages with a ``torch.distributed.pipelining`` schedule, whose buffers are
sized once for fixed micro-batch shapes. Inference changes shape every call (the prompt,
then one token at a time with a growing KV cache), so it moves tensors with plain
point-to-point messages instead: each stage's rank receives its inputs from the rank of the
previous stage with the same (dp, tp) coordinate, runs its layers and sends the outputs on.
A small header (count, dtypes, shapes) precedes the tensors so any tuple can travel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as torch_dist

from libai import dist

_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
]
_MAX_DIMS = 6


def _header(tensors: Sequence[torch.Tensor | None], device) -> torch.Tensor:
    """``[count, (dtype, ndim, d0..d5) per tensor]``; ``ndim = -1`` marks a ``None``."""
    rows = [[len(tensors)] + [0] * (_MAX_DIMS + 1)]
    for t in tensors:
        if t is None:
            rows.append([0, -1] + [0] * _MAX_DIMS)
            continue
        if t.dim() > _MAX_DIMS or t.dtype not in _DTYPES:
            raise ValueError(f"cannot send a {t.dtype} tensor of shape {tuple(t.shape)}")
        shape = list(t.shape) + [0] * (_MAX_DIMS - t.dim())
        rows.append([_DTYPES.index(t.dtype), t.dim()] + shape)
    return torch.tensor(rows, dtype=torch.int64, device=device).flatten()


def _empty(row: list[int], device) -> torch.Tensor | None:
    """An uninitialized tensor for one header row (``None`` for a ``None`` entry)."""
    dtype_code, ndim, *shape = row
    return None if ndim < 0 else torch.empty(shape[:ndim], dtype=_DTYPES[dtype_code], device=device)


class StagePipe:
    """This rank's place in the inference pipeline and the messages between stages.

    With one pipeline stage every method is local (no communication).
    """

    def __init__(self, util: dist.DistUtil | None = None):
        util = util or dist.get_dist_util()
        layout = util.layout
        if layout.virtual_pipeline_size > 1:
            raise ValueError(
                "inference runs one pipeline stage per rank; set virtual_pipeline_size=1"
            )
        self.device = util.device
        self.num_stages = layout.pipeline_parallel_size
        self.stage = util.pipeline_rank
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.num_stages - 1
        self.group = util.pp_group
        self.ranks = (
            torch_dist.get_process_group_ranks(self.group) if self.group is not None else []
        )

    # ---- point to point ---------------------------------------------------------------------
    def send(self, tensors: Sequence[torch.Tensor | None]) -> None:
        """Send ``tensors`` to the next stage."""
        dst = self.ranks[self.stage + 1]
        header = _header(tensors, self.device)
        width = _MAX_DIMS + 2
        torch_dist.send(header[:width].clone(), dst=dst)  # the count first: it sizes the rest
        if tensors:
            torch_dist.send(header[width:].clone(), dst=dst)
        for t in tensors:
            if t is not None:
                torch_dist.send(t.detach().contiguous(), dst=dst)

    def recv(self) -> tuple[torch.Tensor | None, ...]:
        """Receive the tuple the previous stage sent."""
        src = self.ranks[self.stage - 1]
        first = torch.empty(_MAX_DIMS + 2, dtype=torch.int64, device=self.device)
        torch_dist.recv(first, src=src)
        n = int(first[0])
        meta = torch.empty(n * (_MAX_DIMS + 2), dtype=torch.int64, device=self.device)
        if n:
            torch_dist.recv(meta, src=src)
        out = [_empty(row, self.device) for row in meta.view(n, _MAX_DIMS + 2).tolist()]
        for t in out:
            if t is not None:
                torch_dist.recv(t, src=src)
        return tuple(out)

    def run(self, stage_fn: Callable[..., object], *first_inputs, **stage_kwargs) -> object | None:
        """Run one forward through every stage: the first stage calls
        ``stage_fn(*first_inputs, **stage_kwargs)``, each later stage ``stage_fn(*what the
        previous one returned, **stage_kwargs)`` (``stage_kwargs`` are each stage's own, not
        sent). Returns the last stage's result there, ``None`` on other stages."""
        xs = first_inputs if self.is_first else self.recv()
        out = stage_fn(*xs, **stage_kwargs)
        if self.is_last:
            return out
        self.send(out if isinstance(out, tuple) else (out,))
        return None

    # ---- from the last stage to every stage -------------------------------------------------
    def broadcast_from_last(
        self, tensors: Sequence[torch.Tensor | None] | None
    ) -> tuple[torch.Tensor | None, ...]:
        """The last stage's ``tensors`` on every stage (pass ``None`` on the others)."""
        if self.group is None:
            return tuple(tensors)
        src = self.ranks[-1]
        if self.is_last:
            header = _header(tensors, self.device)
            size = torch.tensor([header.numel()], dtype=torch.int64, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
        torch_dist.broadcast(size, src=src, group=self.group)
        if not self.is_last:
            header = torch.empty(int(size), dtype=torch.int64, device=self.device)
        torch_dist.broadcast(header, src=src, group=self.group)
        if self.is_last:
            out = [None if t is None else t.detach().contiguous() for t in tensors]
        else:
            rows = header.view(-1, _MAX_DIMS + 2).tolist()[1:]
            out = [_empty(row, self.device) for row in rows]
        for t in out:
            if t is not None:
                torch_dist.broadcast(t, src=src, group=self.group)
        return tuple(out)

    def broadcast_object_from_last(self, obj):
        """A picklable object of the last stage on every stage."""
        if self.group is None:
            return obj
        box = [obj if self.is_last else None]
        torch_dist.broadcast_object_list(box, src=self.ranks[-1], group=self.group)
        return box[0]
