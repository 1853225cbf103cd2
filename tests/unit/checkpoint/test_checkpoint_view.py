"""The layout-independent checkpoint view (``libai.checkpoint.view``), one function at a time.

References are written in the tests: the rows each rank of an evenly sharded logical tensor
holds (``torch.chunk`` of the logical tensor), the checkpoint keys and tied mappings worked
out by hand. The multi-rank cases play one rank of a larger world on PyTorch's ``fake``
process group (no communication: each rank's shard is built from the global tensor) or
replace the one collective of ``tied_weights`` by the other ranks' answers.
"""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from libai import dist
from libai.checkpoint import view as ckpt_view


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int):
    """This process plays ``rank`` of a ``world_size`` world (fake collectives); no
    process group and no mesh after the block."""
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    dist.reset_dist_util()
    torch_dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield DeviceMesh("cpu", list(range(world_size)))
    finally:
        torch_dist.destroy_process_group()
        dist.reset_dist_util()


def padded_global(rows: int, cols: int) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


def shard_of(tensor: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s rows of ``Shard(0)`` (torch.chunk's split; empty past the end)."""
    chunks = torch.chunk(tensor, world, dim=0)
    return chunks[rank] if rank < len(chunks) else tensor[tensor.shape[0] :]


def assert_shares_storage(view: torch.Tensor, base: torch.Tensor) -> None:
    """Writing into ``view`` lands in ``base`` (what a DCP load into the view relies on)."""
    if view.numel() == 0:
        return
    before = base.clone()
    view.add_(1000.0)
    assert not torch.equal(base, before)
    view.sub_(1000.0)
    assert torch.equal(base, before)


# ---- _logical_view -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (5, 3), (2, 3, 4), (2, 1, 3, 5)])
def test_contiguous_stride_is_torchs(shape):
    assert ckpt_view._contiguous_stride(shape) == torch.empty(shape).stride()


# ---- _logical_view (plain and sharded) -----------------------------------------------------------------------
def test_a_plain_tensor_is_narrowed_in_place():
    t = padded_global(12, 4)
    v = ckpt_view._logical_view(t, (10, 3), "w")
    assert v.shape == (10, 3) and torch.equal(v, padded_global(12, 4)[:10, :3])
    assert_shares_storage(v, t)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_sharded_dtensor_keeps_each_ranks_unpadded_rows(rank):
    """Vocab padded 10 -> 12 on 3 ranks (4 rows each), columns padded 3 -> 4: each rank
    holds its rows of the logical (10, 3) tensor, sharded as torch.chunk shards it."""
    full = padded_global(12, 4)
    with fake_rank(rank, 3) as mesh:
        local = shard_of(full, rank, 3).clone()
        t = DTensor.from_local(local, mesh, [Shard(0)], shape=full.shape, stride=full.stride())
        v = ckpt_view._logical_view(t, [10, 3], "w")
        assert isinstance(v, DTensor)
        assert v.shape == (10, 3) and v.stride() == (3, 1)
        assert v.device_mesh is mesh and tuple(v.placements) == (Shard(0),)
        expected = shard_of(full[:10, :3], rank, 3)
        assert torch.equal(v.to_local(), expected)
        assert_shares_storage(v.to_local(), local)


def test_a_replicated_dtensor_is_a_view_of_the_whole_local_tensor():
    full = padded_global(12, 4)
    with fake_rank(1, 2) as mesh:
        local = full.clone()
        t = DTensor.from_local(local, mesh, [Replicate()], shape=full.shape, stride=full.stride())
        v = ckpt_view._logical_view(t, (10, 3), "w")
        assert v.shape == (10, 3) and v.stride() == (3, 1)
        assert tuple(v.placements) == (Replicate(),)
        assert torch.equal(v.to_local(), full[:10, :3])
        assert_shares_storage(v.to_local(), local)  # not a contiguous copy


def test_a_rank_past_the_logical_end_holds_an_empty_shard():
    """Logical 5 rows padded to 8 on 4 ranks (2 each): rank 3 holds only padding; its
    logical shard is empty (torch puts the offset of an empty shard at the end, 5, not 6)."""
    full = padded_global(8, 3)
    with fake_rank(3, 4) as mesh:
        local = shard_of(full, 3, 4).clone()
        t = DTensor.from_local(local, mesh, [Shard(0)], shape=full.shape, stride=full.stride())
        v = ckpt_view._logical_view(t, (5, 3), "w")
        assert v.shape == (5, 3) and tuple(v.to_local().shape) == (0, 3)


@pytest.mark.parametrize(
    "rank, world, padded, logical",
    [
        (0, 3, 12, 6),  # 4 padded rows per rank, but 2 logical ones: sizes differ
        (1, 3, 12, 6),  # rank 1 holds 2 valid rows, as many as wanted, from offset 4, not 2
        (1, 3, 6, 3),  # one valid row at offset 2; the logical shard starts at 1
    ],
)
def test_padding_that_is_no_even_sharding_is_refused(rank, world, padded, logical):
    full = padded_global(padded, 2)
    with fake_rank(rank, world) as mesh:
        local = shard_of(full, rank, world).clone()
        t = DTensor.from_local(local, mesh, [Shard(0)], shape=full.shape, stride=full.stride())
        with pytest.raises(NotImplementedError, match="vocab_weight"):
            ckpt_view._logical_view(t, (logical, 2), "vocab_weight")
        # through build_view: the parameter's name is in the error
        model = nn.Module()
        model.emb = nn.Parameter(t, requires_grad=False)
        model.emb.libai_logical_shape = (logical, 2)
        with pytest.raises(NotImplementedError, match="emb"):
            ckpt_view.build_view(model, {"emb": model.emb}, {}, {}, for_load=False)


# ---- _split_optim_key --------------------------------------------------------------------
def test_split_optim_key_with_nested_names():
    fqns = {"a.b", "w"}
    assert ckpt_view._split_optim_key("state.a.b.x.y", fqns) == ("state.", "a.b", "x.y")
    assert ckpt_view._split_optim_key("state.a.b.c.x.y", {"a.b.c"}) == (
        "state.",
        "a.b.c",
        "x.y",
    )
    assert ckpt_view._split_optim_key("param_groups.w.lr", fqns) == ("param_groups.", "w", "lr")
    with pytest.raises(KeyError, match="state.w"):  # a state entry without a name
        ckpt_view._split_optim_key("state.w", fqns)


# ---- tied_weights ------------------------------------------------------------------------
def module_with(*names, groups=None, copies=()):
    module = nn.Module()
    for name in names:
        p = nn.Parameter(torch.zeros(2))
        if groups and name in groups:
            p.libai_tied_group = groups[name]
        if name in copies:
            p.libai_tied_copy = True
        module.register_parameter(name, p)
    return module


def test_a_declared_mapping_wins_over_the_tied_groups():
    model = module_with("embed", "head", "other")  # no tied groups at all
    model.checkpoint_tied_weights = {"head": "embed", "gone": "embed"}
    assert ckpt_view.tied_weights(model) == {"head": "embed"}  # copies this rank holds

    class Declares(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Parameter(torch.zeros(2))
            self.head = nn.Parameter(torch.zeros(2))
            for p in (self.embed, self.head):
                p.libai_tied_group = "g"  # inferred: head -> embed; declared the other way

        def checkpoint_tied_weights(self):
            return {"embed": "head"}

    assert ckpt_view.tied_weights(Declares()) == {"embed": "head"}


def test_the_marked_copy_is_never_canonical_even_when_it_comes_first():
    dist.setup_dist_util({})
    groups = {"head": "g", "embed": "g", "b": "h", "a": "h"}
    model = module_with("head", "embed", "b", "a", groups=groups, copies=("head",))
    # g: one unmarked member (embed); h: none marked, the first in order (b)
    assert ckpt_view.tied_weights(model) == {"head": "embed", "a": "b"}


def test_tied_weights_without_a_process_group():
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    dist.reset_dist_util()  # the next test that needs a mesh builds a world of one
    model = module_with("x", "y", groups={"x": "g", "y": "g"})
    with dist.use_dist_util(SimpleNamespace(pipeline_rank=0)):
        assert ckpt_view.tied_weights(model) == {"y": "x"}


class TwoRanks:
    """``torch.distributed`` for ``tied_weights`` on rank 1 of 2: the all-gather returns
    rank 0's ``other`` and this rank's own entry."""

    def __init__(self, other):
        self.other = other
        self.gathers = 0

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 2

    def all_gather_object(self, out, obj):
        assert out == [None, None] and obj is not None
        self.gathers += 1
        out[0], out[1] = self.other, obj


def test_tied_groups_are_gathered_across_pipeline_stages(monkeypatch):
    """Rank 1 (the last stage) holds the head, unmarked, first in its order; rank 0 (the
    first stage) holds the embedding at order 3. The first stage's member is canonical."""
    stage0 = (0, [("g", "word", False, 3), ("h", "s0", False, 0)])
    fake = TwoRanks(stage0)
    monkeypatch.setattr(ckpt_view, "torch_dist", fake)
    model = module_with("head", "s1", groups={"head": "g", "s1": "h"})
    with dist.use_dist_util(SimpleNamespace(pipeline_rank=1)):
        mapping = ckpt_view.tied_weights(model)
    assert fake.gathers == 1
    assert mapping == {"head": "word", "s1": "s0"}  # only the copies this rank holds


# ---- build_view and StateView.write_back -------------------------------------------------
class Toy(nn.Module):
    def __init__(self, *names):
        super().__init__()
        for name in names:
            self.register_parameter(name, nn.Parameter(torch.zeros(2)))


def group_archive(group: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(group, buffer)
    return buffer.getvalue()


def test_objects_and_hyper_parameters_are_written_back():
    model = Toy("w")
    model_sd = {"w": torch.zeros(2), "x._extra_state": {"a": 1}}
    osd = {
        "state.w.step": 3,
        "state.w.momentum_buffer": torch.zeros(2),
        "param_groups.w.lr": 0.1,
        "param_groups.w.momentum": 0.9,
    }
    v = ckpt_view.build_view(model, model_sd, {"opt": osd}, {}, for_load=True)
    assert set(v.entries) == {
        "model.w",
        "model.x._extra_state",
        "opt.state.w.step",
        "opt.state.w.momentum_buffer",
        "opt.param_groups.w",
    }
    assert torch.load(io.BytesIO(v.entries["opt.param_groups.w"])) == {"lr": 0.1, "momentum": 0.9}
    # what a load puts in place of the objects
    v.entries["model.x._extra_state"] = {"a": 2}
    v.entries["opt.state.w.step"] = 7
    v.entries["opt.param_groups.w"] = group_archive({"lr": 0.5})  # no momentum saved
    v.write_back()
    assert model_sd["x._extra_state"] == {"a": 2}
    assert osd["state.w.step"] == 7
    assert osd["param_groups.w.lr"] == 0.5 and osd["param_groups.w.momentum"] == 0.9


def test_a_tied_copy_is_saved_once_and_filled_on_load():
    tied = {"at": "embed"}  # a short copy name: "at" is also inside "state."
    model = Toy("at", "embed", "w")

    def sds():
        model_sd = {"at": torch.zeros(2), "embed": torch.zeros(2), "w": torch.zeros(2)}
        osd = {
            "state.at.momentum_buffer": torch.zeros(2),
            "param_groups.at.lr": 0.1,
            "state.embed.momentum_buffer": torch.zeros(2),
            "param_groups.embed.lr": 0.1,
            "state.w.momentum_buffer": torch.zeros(2),
            "param_groups.w.lr": 0.1,
        }
        return model_sd, osd

    model_sd, osd = sds()
    saved = ckpt_view.build_view(model, model_sd, {"opt": osd}, tied, for_load=False)
    assert set(saved.entries) == {
        "model.embed",
        "model.w",
        "opt.state.embed.momentum_buffer",
        "opt.param_groups.embed",
        "opt.state.w.momentum_buffer",
        "opt.param_groups.w",
    }
    model_sd, osd = sds()
    loaded = ckpt_view.build_view(model, model_sd, {"opt": osd}, tied, for_load=True)
    assert set(loaded.entries) == set(saved.entries)
    loaded.entries["model.embed"].copy_(torch.tensor([1.0, 2.0]))  # as dcp.load does
    loaded.entries["opt.state.embed.momentum_buffer"].copy_(torch.tensor([3.0, 4.0]))
    loaded.entries["opt.param_groups.embed"] = group_archive({"lr": 0.25})
    loaded.entries["opt.param_groups.w"] = group_archive({"lr": 0.5})
    loaded.write_back()
    assert torch.equal(model_sd["at"], torch.tensor([1.0, 2.0]))
    assert torch.equal(osd["state.at.momentum_buffer"], torch.tensor([3.0, 4.0]))
    assert osd["param_groups.at.lr"] == 0.25 and osd["param_groups.w.lr"] == 0.5


def test_a_tied_copy_whose_canonical_weight_is_elsewhere_loads_from_its_entry():
    model = Toy("head")  # the embedding lives on another rank
    model_sd = {"head": torch.zeros(2)}
    osd = {"state.head.momentum_buffer": torch.zeros(2), "param_groups.head.lr": 0.1}
    v = ckpt_view.build_view(model, model_sd, {"opt": osd}, {"head": "embed"}, for_load=True)
    assert set(v.entries) == {
        "model.embed",
        "opt.state.embed.momentum_buffer",
        "opt.param_groups.embed",
    }
    assert v.entries["model.embed"] is model_sd["head"] and not v.deferred
