"""The data-parallel gradient all-reduce overlapped with backward (DDP's idea, on libai's
parameters: plain tensors or DTensor shards, whose local values are reduced).

Parameters are grouped into buckets of about ``bucket_bytes`` in reverse order (the order
backward produces their gradients). When the last gradient of a bucket has been accumulated
(a ``post_accumulate_grad`` hook), the bucket's flattened gradients go out in an
asynchronous all-reduce while backward continues; buckets are launched strictly in bucket
order, so every rank issues the same collectives in the same order. :meth:`finish` launches
what is left (parameters that got no gradient are left out, as in the synchronous path),
waits, averages over the data-parallel ranks and writes the results back.

The sums are element-wise over the same values as the synchronous all-reduce after backward:
bitwise equal on 2 data ranks (a sum of two is exact in any order), equal to fp32 rounding on
more (the collective's reduction order depends on the buffer, and the buckets differ). Only
the last micro-batch of a step is armed (gradient accumulation adds into the same ``.grad``).
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

__all__ = ["OverlappedGradReducer"]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class OverlappedGradReducer:
    """Async, bucketed dp all-reduce of ``params``' gradients during backward.

    Args:
        params: the model's parameters (those requiring grad are reduced).
        group: the data-parallel process group.
        dp_size: its size (the average's divisor).
        bucket_bytes: approximate bytes of gradients per all-reduce.
    """

    def __init__(self, params, group, dp_size: int, bucket_bytes: int = 25 * 2**20):
        self.group, self.dp_size = group, dp_size
        self.buckets: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in reversed([p for p in params if p.requires_grad]):
            nbytes = _local(p).numel() * p.element_size()
            if self.buckets[-1] and (
                size + nbytes > bucket_bytes or p.dtype != self.buckets[-1][0].dtype
            ):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)
            for bucket in self.buckets
            for p in bucket
        ]
        self.armed = False
        #: buckets launched while backward was still running, in the last armed step
        self.launched_in_backward = 0

    def arm(self) -> None:
        """Reduce during the next backward (the step's last micro-batch)."""
        self.armed = True
        self._remaining = [len(bucket) for bucket in self.buckets]
        self._next = 0
        self._pending: list[tuple] = []
        self.launched_in_backward = 0

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.armed:
            return
        b = self.bucket_of[id(param)]
        self._remaining[b] -= 1
        while self._next < len(self.buckets) and self._remaining[self._next] == 0:
            self._launch(self._next)
            self.launched_in_backward += 1

    def _launch(self, b: int) -> None:
        grads = [_local(p.grad) for p in self.buckets[b] if p.grad is not None]
        self._next = b + 1
        if not grads:
            return
        flat = grads[0] if len(grads) == 1 else _flatten_dense_tensors(grads)
        handle = torch_dist.all_reduce(flat, group=self.group, async_op=True)
        self._pending.append((handle, flat, grads))

    def finish(self) -> None:
        """Launch the buckets left, wait for every all-reduce, average, write back."""
        if not self.armed:
            raise RuntimeError("OverlappedGradReducer.finish without arm()")
        while self._next < len(self.buckets):
            self._launch(self._next)
        for handle, flat, grads in self._pending:
            handle.wait()
            flat /= self.dp_size
            if len(grads) > 1:
                for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                    g.copy_(synced)
        self._pending, self.armed = [], False

    def remove(self) -> None:
        """Remove the hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
