"""How the overlapped dp all-reduce groups gradients into buckets (hand-counted bytes), and
that its hooks come off. (Its numbers on dp ranks: tests/distributed/test_grad_overlap.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from libai.runtime.grad_overlap import OverlappedGradReducer


def params(*specs):
    """Plain parameters of (numel, dtype)."""
    return [nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in specs]


def bucket_indices(reducer, ps):
    index = {id(p): i for i, p in enumerate(ps)}
    return [[index[id(p)] for p in bucket] for bucket in reducer.buckets]


def test_buckets_fill_to_the_byte_budget_in_reverse_order():
    ps = params(*[(4, torch.float32)] * 5)  # 16 bytes each
    # 32 bytes: two per bucket exactly (a bucket may reach the budget, not pass it)
    reducer = OverlappedGradReducer(ps, group=None, dp_size=2, bucket_bytes=32)
    assert bucket_indices(reducer, ps) == [[4, 3], [2, 1], [0]]
    # nothing armed or launched before the first step
    assert reducer.armed is False and reducer.launched_in_backward == 0
    assert reducer.bucket_of == {id(p): [2, 1, 1, 0, 0][i] for i, p in enumerate(ps)}
    # one byte short of two: one per bucket
    reducer = OverlappedGradReducer(ps, group=None, dp_size=2, bucket_bytes=31)
    assert bucket_indices(reducer, ps) == [[4], [3], [2], [1], [0]]
    # a parameter bigger than the budget still gets a bucket of its own
    big = params((4, torch.float32), (100, torch.float32), (4, torch.float32))
    reducer = OverlappedGradReducer(big, group=None, dp_size=2, bucket_bytes=32)
    assert bucket_indices(reducer, big) == [[2], [1], [0]]


def test_a_new_dtype_starts_a_new_bucket_and_frozen_parameters_are_left_out():
    ps = params((2, torch.float32), (2, torch.float16), (2, torch.float16), (2, torch.float32))
    ps[0].requires_grad_(False)
    reducer = OverlappedGradReducer(ps, group=None, dp_size=2)
    assert bucket_indices(reducer, ps) == [[3], [2, 1]]
    assert id(ps[0]) not in reducer.bucket_of


def record_launches(reducer) -> list[int]:
    """Replace ``reducer``'s launch with one that records the bucket index and advances the
    reducer's state as ``_launch`` does, without the collective; returns the record."""
    launched = []

    def launch(b):
        launched.append(b)
        reducer._next = b + 1

    reducer._launch = launch
    return launched


def test_remove_takes_the_hooks_off():
    # armed hooks launch each bucket as its gradients come in (the launches are recorded
    # here, not sent: no process group is needed); after remove() nothing is launched
    ps = params((3, torch.float32), (3, torch.float32))
    hooked = OverlappedGradReducer(ps, group=None, dp_size=2, bucket_bytes=12)
    removed = OverlappedGradReducer(ps, group=None, dp_size=2, bucket_bytes=12)
    launches = {id(r): record_launches(r) for r in (hooked, removed)}
    hooked.arm()
    removed.arm()
    removed.remove()
    removed.remove()  # twice is harmless
    sum(p.sum() for p in ps).backward()
    assert launches[id(hooked)] == [0, 1] and hooked.launched_in_backward == 2
    assert launches[id(removed)] == [] and removed.launched_in_backward == 0
    assert all(torch.equal(p.grad, torch.ones(3)) for p in ps)


def test_finish_launches_the_buckets_backward_left_and_disarms():
    # a parameter that gets no gradient keeps its bucket (and every later one) from going
    # out during backward: finish() launches them, in bucket order, then needs a new arm()
    ps = params((4, torch.float32), (4, torch.float32), (4, torch.float32))
    reducer = OverlappedGradReducer(ps, group=None, dp_size=2, bucket_bytes=16)
    launched = record_launches(reducer)
    reducer.arm()
    (ps[0].sum() + ps[2].sum()).backward()  # buckets [[2], [1], [0]]: [1] gets no gradient
    assert launched == [0] and reducer.launched_in_backward == 1
    reducer.finish()
    assert launched == [0, 1, 2] and not reducer.armed
    with pytest.raises(RuntimeError, match="without arm"):
        reducer.finish()
