"""``libai.runtime.grad_clip`` against an independent reference, in one process.

The dist util is replaced by a stand-in whose tp / dp / pp / shard groups are plain marker
objects, and ``torch.distributed.all_reduce`` by a stand-in that adds (or, for MAX, takes
the max with) a known contribution of the peers of that group, written out here as the
peers' own gradients. So which terms are reduced over which group is visible: the expected
norm is ``torch.nn.utils.get_total_norm`` over the full, unsharded gradients (this rank's
and the peers'), and the clipped gradients are those of ``torch.nn.utils.clip_grad_norm_``
on copies of the same full gradients. DTensor parameters live on a mesh of one rank.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from libai import dist
from libai.runtime import grad_clip

INF = float("inf")
NORMS = [2.0, 1.0, 3.0, INF]
TP, DP, PP, SHARD = "tp-group", "dp-group", "pp-group", "shard-group"


def term(grads, p):
    """What one rank contributes: sum |g|^p, or max |g| for inf (reference, by hand)."""
    flat = torch.cat([g.detach().reshape(-1).double().abs() for g in grads])
    return flat.max() if p == INF else (flat**p).sum()


class Peers:
    """Stand-in for ``all_reduce``: adds the peers' contribution for a known group."""

    def __init__(self, contributions):
        self.contributions = contributions  # group -> tensor (or callable of op) or None
        self.calls = []

    def __call__(self, tensor, op=torch_dist.ReduceOp.SUM, group=None, async_op=False):
        self.calls.append((group, op, tuple(tensor.shape)))
        c = self.contributions.get(group)
        if c is None:
            return None
        c = torch.as_tensor(c, dtype=tensor.dtype)
        if op == torch_dist.ReduceOp.MAX:
            tensor.copy_(torch.maximum(tensor, c))
        else:
            tensor.add_(c)
        return None


@pytest.fixture
def world():
    """A world of one (for the DTensor meshes) and a patchable dist util."""
    dist.get_dist_util()
    util = types.SimpleNamespace(
        device=torch.device("cpu"), tp_group=None, dp_group=None, pp_group=None,
        grad_group=None,
        stage_dims=("dp", "tp"),
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "get_dist_util", lambda: util)

        def peers(contributions):
            fake = Peers(contributions)
            mp.setattr(torch_dist, "all_reduce", fake)
            return fake

        yield util, peers


def mesh(names=("dp", "tp")):
    return DeviceMesh("cpu", torch.zeros(1, 1, dtype=torch.int), mesh_dim_names=names)


def param(grad, placements=None, device_mesh=None, tied=False):
    """A tensor with ``grad`` (a DTensor on ``device_mesh`` when ``placements`` is given)."""
    if placements is not None:
        m = device_mesh if device_mesh is not None else mesh()
        p = DTensor.from_local(torch.zeros_like(grad), m, placements, run_check=False)
        p.grad = DTensor.from_local(grad.clone(), m, placements, run_check=False)
    else:
        p = torch.zeros_like(grad)
        p.grad = grad.clone() if grad is not None else None
    if tied:
        p.libai_tied_copy = True
    return p


def local(p):
    return p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad


def g(seed, *shape, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen) * scale


def check_clipped(params, locals_, full, max_norm, p, total):
    """The local gradients equal torch's clip of the full gradients ``full`` (the counted
    ones, where each of ``locals_`` is, or else is clipped by the same factor)."""
    ref = [param(t) for t in full]
    torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type=p)
    ref = [r.grad for r in ref]
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    for q, orig in zip(params, locals_):
        for f, r in zip(full, ref):
            if f is orig:
                torch.testing.assert_close(local(q), r, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(local(q), orig * coef, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("p", NORMS)
def test_tp_sharded_and_replicated_terms_pp_stages_and_clip(world, p):
    util, peers = world
    util.tp_group, util.pp_group = TP, PP
    a, b = g(1, 4, 3), g(2, 5)  # this rank's shards of two tp-sharded weights
    a_peer, b_peer = g(3, 4, 3, scale=2.5), g(4, 5, scale=0.5)  # the other tp rank's shards
    r, r2 = g(5, 6, scale=1.7), g(6, 2, 2, scale=3.0)  # replicated over tp
    other_stage = [g(7, 7, scale=1.3), g(8, 3)]  # the other pipeline stage's gradients
    tied = g(9, 3, scale=50.0)  # last stage's copy of a tied weight: not counted
    params = [
        param(a, [Replicate(), Shard(0)]),
        param(r),
        param(torch.zeros(3)),  # placeholder, its grad removed below
        param(b, [Replicate(), Shard(0)], device_mesh=mesh(None)),  # unnamed: stage dims
        param(r2, [Shard(0), Replicate()]),  # sharded over dp, not tp
        param(tied, tied=True),
    ]
    params[2].grad = None
    fake = peers(
        {TP: term([a_peer, b_peer], p), PP: term(other_stage, p)}
    )  # a replicated gradient wrongly summed over tp would be counted twice
    full = [a, a_peer, b, b_peer, r, r2, *other_stage]
    expected = torch.nn.utils.get_total_norm(full, norm_type=p)
    max_norm = 0.37 * float(expected)

    total = grad_clip.clip_grad_norm_(params, max_norm, p)

    assert total.dtype == torch.float32 and total.shape == ()
    torch.testing.assert_close(total, expected.float(), rtol=1e-5, atol=0)
    op = torch_dist.ReduceOp.MAX if p == INF else torch_dist.ReduceOp.SUM
    assert [(c[0], c[1]) for c in fake.calls] == [(TP, op), (PP, op)]
    held = [params[i] for i in (0, 1, 3, 4, 5)]
    check_clipped(held, [a, r, b, r2, tied], full, max_norm, p, total)
    assert params[2].grad is None


@pytest.mark.parametrize("p", NORMS)
def test_no_clip_below_max_norm_leaves_grads_bitwise_and_returns_norm(world, p):
    util, peers = world
    peers({})
    grads = [g(11, 5), g(12, 2, 3, scale=0.2), g(13, 1)]
    params = [param(x) for x in grads]
    expected = torch.nn.utils.get_total_norm(grads, norm_type=p)
    total = grad_clip.clip_grad_norm_(params, float(expected) * 1.5, p)
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=0)
    for q, x in zip(params, grads):
        assert torch.equal(q.grad, x)
    # exactly at the norm: coef = max_norm / (total + 1e-6) < 1
    total = grad_clip.clip_grad_norm_(params, float(expected), p)
    coef = float(expected) / (float(total) + 1e-6)
    assert coef < 1.0
    for q, x in zip(params, grads):
        torch.testing.assert_close(q.grad, x * coef, rtol=1e-6, atol=0)


@pytest.mark.parametrize("p", NORMS)
@pytest.mark.parametrize("shard_group", [None, SHARD])
def test_dp_sharded_terms_summed_over_the_shard_group(world, p, shard_group):
    """ZeRO: this rank holds the gradients of parameters 0 and 2, its dp peer that of 1
    (tp-sharded, so it is also summed over tp). The per-parameter terms are summed over
    ``shard_group`` when given, else over the gradient group (dp; dp x cp under context
    parallel); the other group contributes nothing."""
    util, peers = world
    util.dp_group = util.grad_group = DP
    util.tp_group = TP
    group = DP if shard_group is None else shard_group
    x0, x1, x2 = g(21, 4, scale=2.0), g(22, 3, 2, scale=1.5), g(23, 5)
    x1_tp_peer = g(24, 3, 2, scale=0.7)
    params = [param(x0), param(x1, [Replicate(), Shard(0)]), param(x2)]
    params[1].grad = None  # held by the dp peer
    peer_terms = torch.stack([torch.tensor(0.0), term([x1], p), torch.tensor(0.0)])
    other = SHARD if group == DP else DP
    fake = peers({group: peer_terms, other: peer_terms * 100, TP: term([x1_tp_peer], p)})
    expected = torch.nn.utils.get_total_norm([x0, x1, x1_tp_peer, x2], norm_type=p)

    terms = grad_clip._parameter_terms(params, p, True, dist.get_dist_util(), shard_group)
    want = [term([x0], p), term([x1], p), term([x2], p)]
    torch.testing.assert_close(torch.stack(terms), torch.stack(want).float(), rtol=1e-5, atol=0)
    assert fake.calls[-1] == (group, torch_dist.ReduceOp.SUM, (3,))

    max_norm = 0.5 * float(expected)
    total = grad_clip.clip_grad_norm_(params, max_norm, p, dp_sharded=True, shard_group=shard_group)
    torch.testing.assert_close(total, expected.float(), rtol=1e-5, atol=0)
    check_clipped([params[0], params[2]], [x0, x2], [x0, x1, x1_tp_peer, x2], max_norm, p, total)
    assert params[1].grad is None


def test_not_dp_sharded_does_not_reduce_over_dp(world):
    util, peers = world
    util.dp_group = util.grad_group = DP
    fake = peers({DP: torch.tensor([100.0, 100.0])})
    x = [g(31, 3), g(32, 4)]
    params = [param(t) for t in x]
    total = grad_clip.clip_grad_norm_(params, 1e6, 2.0, shard_group=SHARD)
    torch.testing.assert_close(total, torch.nn.utils.get_total_norm(x), rtol=1e-6, atol=0)
    assert fake.calls == []


def test_is_tp_sharded_uses_mesh_names_then_stage_dims(world):
    util, _ = world
    util.stage_dims = ("tp", "dp")  # differs from the mesh's own names
    x = g(41, 2)
    assert not grad_clip._is_tp_sharded(x, util)
    assert not grad_clip._is_tp_sharded(param(x), util)
    assert grad_clip._is_tp_sharded(param(x, [Replicate(), Shard(0)]), util)
    assert not grad_clip._is_tp_sharded(param(x, [Shard(0), Replicate()]), util)
    # no names on the mesh: the stage dims name its dims
    assert grad_clip._is_tp_sharded(param(x, [Shard(0), Replicate()], device_mesh=mesh(None)), util)
    assert not grad_clip._is_tp_sharded(
        param(x, [Replicate(), Shard(0)], device_mesh=mesh(None)), util
    )


@pytest.mark.parametrize("p", NORMS)
def test_terms_are_fp32_of_the_local_shard(world, p):
    xs = [g(51, 6).half() * 3, g(52, 2, 2).to(torch.bfloat16)]  # low precision
    grads = [xs[0], DTensor.from_local(xs[1], mesh(), [Replicate(), Shard(0)], run_check=False)]
    terms = grad_clip._terms(grads, p)
    assert [t.dtype for t in terms] == [torch.float32, torch.float32]
    torch.testing.assert_close(
        torch.stack(terms), torch.stack([term([x], p) for x in xs]).float(), rtol=1e-5, atol=0
    )
    assert grad_clip._terms([], p) == []


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("p", [2.0, INF])
def test_zero_terms_are_fp32_on_the_util_device(world, p):
    """The 0 of a parameter without a gradient and of an empty group: fp32 (whatever the
    default dtype) on the util's device (the accelerator in a real run; meta here)."""
    util, peers = world
    peers({})
    with default_dtype(torch.float64):
        x = g(61, 3).float()
        params = [param(x), param(torch.zeros(2, dtype=torch.float32))]
        params[1].grad = None
        total = grad_clip.clip_grad_norm_(params, 1e6, p)
        assert total.dtype == torch.float32
        torch.testing.assert_close(total, torch.nn.utils.get_total_norm([x], norm_type=p))
        (zero,) = grad_clip._parameter_terms([params[1]], p, False, util)
        assert zero.dtype == torch.float32 and float(zero) == 0.0
        empty = grad_clip._combine([], p, util.device)
        assert empty.dtype == torch.float32 and float(empty) == 0.0
    util.device = torch.device("meta")
    assert grad_clip._combine([], p, util.device).device.type == "meta"
    assert grad_clip._parameter_terms([params[1]], p, False, util)[0].device.type == "meta"


def test_combine_sums_or_takes_the_max(world):
    t = [torch.tensor(1.5), torch.tensor(4.0), torch.tensor(2.0)]
    assert float(grad_clip._combine(t, 2.0, None)) == 7.5
    assert float(grad_clip._combine(t, 3.0, None)) == 7.5
    assert float(grad_clip._combine(t, INF, None)) == 4.0


def test_default_norm_type_is_2(world):
    _, peers = world
    peers({})
    grads = [g(71, 4, scale=2.0), g(72, 3)]
    params = [param(x) for x in grads]
    total = grad_clip.clip_grad_norm_(params, 0.3)
    torch.testing.assert_close(total, torch.nn.utils.get_total_norm(grads), rtol=1e-6, atol=0)
    check_clipped(params, grads, grads, 0.3, 2.0, total)


def test_inf_norm_is_the_max_over_several_tp_sharded_gradients(world):
    """Two tp-sharded and two replicated gradients of about the same size, no peers."""
    _, peers = world
    peers({})
    grads = [g(81, 5), g(82, 4), g(83, 3), g(84, 6)]
    params = [param(x, [Replicate(), Shard(0)]) for x in grads[:2]] + [param(x) for x in grads[2:]]
    total = grad_clip.clip_grad_norm_(params, 0.25, INF)
    torch.testing.assert_close(total, torch.nn.utils.get_total_norm(grads, norm_type=INF))
    check_clipped(params, grads, grads, 0.25, INF, total)
