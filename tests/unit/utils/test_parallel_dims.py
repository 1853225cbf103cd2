"""ParallelDims, the layout as data: sizes derived from a launch as LiBai derives them (dp =
world / (tp x pp x cp)), every size and the borrowed expert ranks checked with one line
naming the key, the mesh's dims in order with tp innermost (rank = ((p * dp + d) * cp + c)
* tp + t, written out here), and a layout's dims equal to its sizes."""

from __future__ import annotations

import itertools

import pytest
import torch.distributed as torch_dist
from test_dist_mesh import fake_rank

from libai import dist
from libai.dist.parallel_dims import MESH_DIMS, ParallelDims


@pytest.mark.parametrize(
    ("world", "tp", "pp", "cp", "dp"),
    [(1, 1, 1, 1, 1), (8, 2, 2, 1, 2), (12, 3, 1, 2, 2), (6, 1, 3, 1, 2), (4, 4, 1, 1, 1)],
)
def test_dp_is_the_world_over_the_model_dims(world, tp, pp, cp, dp):
    dims = ParallelDims.resolve(world, tp=tp, pp=pp, cp=cp)
    assert (dims.pp, dims.dp, dims.cp, dims.tp, dims.ep) == (pp, dp, cp, tp, 1)
    assert (dims.dp_replicate, dims.dp_shard) == (1, dp)
    assert dims.mesh_shape == (pp, dp, cp, tp) and MESH_DIMS == ("pp", "dp", "cp", "tp")
    assert [dims.size(n) for n in MESH_DIMS] == [pp, dp, cp, tp]
    assert ParallelDims.resolve(world, tp=tp, pp=pp, cp=cp, dp=dp) == dims  # given and equal
    assert ParallelDims.resolve(world, tp=tp, pp=pp, cp=cp, dp="auto") == dims


def test_stage_dims_keep_dp_and_tp_of_size_above_one():
    assert ParallelDims.resolve(8, tp=2, pp=2).stage_dims() == ("dp", "tp")
    assert ParallelDims.resolve(4, tp=2, pp=2).stage_dims() == ("tp",)
    assert ParallelDims.resolve(4, pp=2).stage_dims() == ("dp",)
    assert ParallelDims.resolve(2, pp=2).stage_dims() == ()
    assert ParallelDims.resolve(4, cp=4).stage_dims() == ()  # cp is not a layer placement dim


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(world_size=6, tp=4), r"^The world size \(6 processes\) is not divisible by "
         r"tensor_parallel_size \(4\) x pipeline_parallel_size \(1\) = 4\. Launch a multiple of 4"),
        (dict(world_size=6, tp=2, cp=2), r"^The world size \(6 processes\) is not divisible by "
         r"tensor_parallel_size \(2\) x pipeline_parallel_size \(1\) x context_parallel_size "
         r"\(2\) = 4\."),
        (dict(world_size=8, tp=2, dp=2), r"^train\.dist\.data_parallel_size=2 contradicts the "
         r"launch: 8 processes / \(tensor_parallel_size 2 x pipeline_parallel_size 1\) = 4\. "
         r"Set data_parallel_size=4 or None \(derived\), or launch 4 processes"),
        (dict(world_size=8, cp=2, dp=2), r"x context_parallel_size 2\) = 4\."),
        (dict(world_size=4, tp=0), r"^train\.dist\.tensor_parallel_size must be a positive"),
        (dict(world_size=4, pp=True), r"^train\.dist\.pipeline_parallel_size must be a positive"),
        (dict(world_size=4, cp=1.5), r"^train\.dist\.context_parallel_size must be a positive"),
        (dict(world_size=4, ep=-2), r"^train\.dist\.expert_parallel_size must be a positive"),
        (dict(world_size=8, tp=2, ep=3), r"^train\.dist\.expert_parallel_size=3 must divide the "
         r"data-sharding x context-parallel ranks \(4 x 1 = 4\): experts borrow those ranks\. "
         r"Use one of \[1, 2, 4\]"),
    ],
)  # fmt: skip
def test_a_layout_that_does_not_fit_is_one_line_naming_the_key(kwargs, message):
    world = kwargs.pop("world_size")
    with pytest.raises(ValueError, match=message):
        ParallelDims.resolve(world, **kwargs)


def test_experts_borrow_the_data_sharding_and_context_ranks():
    """ep divides dp_shard x cp: 8 ranks of dp2 x cp2 x tp2 take ep 1, 2 or 4."""
    for ep in (1, 2, 4):
        assert ParallelDims.resolve(8, tp=2, cp=2, ep=ep).ep == ep
    with pytest.raises(ValueError, match=r"\(2 x 2 = 4\)"):
        ParallelDims.resolve(8, tp=2, cp=2, ep=8)


def test_built_directly_it_is_checked_and_frozen():
    with pytest.raises(ValueError, match=r"pipeline 1 x data 4 x context 1 x tensor 2 parallel "
                       r"= 8 processes, but the world has 4"):  # fmt: skip
        ParallelDims(world_size=4, dp_shard=4, tp=2)
    with pytest.raises(ValueError, match=r"^ParallelDims\.dp_shard must be a positive"):
        ParallelDims(world_size=4, dp_shard=0)
    hybrid = ParallelDims(world_size=8, dp_replicate=2, dp_shard=4)
    assert hybrid.dp == 8
    assert hybrid.describe() == "mesh pp=1 dp=8 cp=1 tp=1 (dp_replicate=2 x dp_shard=4) (world 8)"
    experts = ParallelDims(world_size=8, dp_shard=4, tp=2, ep=2)
    assert experts.describe() == "mesh pp=1 dp=4 cp=1 tp=2 ep=2 (world 8)"
    with pytest.raises(AttributeError):
        hybrid.tp = 2


def test_a_layouts_dims_are_its_sizes():
    layout = dist.resolve_layout(
        {"tensor_parallel_size": 2, "pipeline_parallel_size": 3, "pipeline_num_layers": 3}, 12
    )
    assert layout.dims == ParallelDims(world_size=12, pp=3, dp_shard=2, tp=2)
    assert layout.dims.describe() == "mesh pp=3 dp=2 cp=1 tp=2 (world 12)"


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), [(2, 1, 2, 2), (1, 2, 3, 1), (2, 3, 1, 2)])
def test_the_mesh_puts_tp_innermost_then_cp_dp_pp(pp, dp, cp, tp):
    """Each rank of the world, played in turn (fake collectives): the mesh holds rank
    ((p * dp + d) * cp + c) * tp + t at coordinate (p, d, c, t), and its coordinate is its."""
    dims = ParallelDims(world_size=pp * dp * cp * tp, pp=pp, dp_shard=dp, cp=cp, tp=tp)
    want = {
        (p, d, c, t): ((p * dp + d) * cp + c) * tp + t
        for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp))
    }
    for coordinate, rank in want.items():
        with fake_rank(rank, dims.world_size):
            mesh = dims.build_mesh("cpu")
            assert mesh.mesh_dim_names == MESH_DIMS
            assert {c: int(mesh.mesh[c]) for c in want} == want
            assert tuple(mesh.get_coordinate()) == coordinate
            if cp > 1:
                peers = [want[(*coordinate[:2], c, coordinate[3])] for c in range(cp)]
                assert sorted(torch_dist.get_process_group_ranks(mesh["cp"].get_group())) == peers


def test_context_parallel_size_is_a_layout_key():
    """``train.dist.context_parallel_size`` takes ranks from dp (dp = world / (tp pp cp))."""
    layout = dist.resolve_layout({"context_parallel_size": 2, "tensor_parallel_size": 2}, 8)
    assert (layout.context_parallel_size, layout.data_parallel_size) == (2, 2)
    assert layout.dims == ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2)
    assert dist.resolve_layout({}, 4).context_parallel_size == 1
    with pytest.raises(ValueError, match="context_parallel_size must be a positive integer"):
        dist.resolve_layout({"context_parallel_size": 0}, 4)


def test_context_parallel_composes_with_pipeline_and_sequence_parallel():
    """cp takes its ranks beside pp (dp = world / (tp pp cp)); sequence parallel splits each
    rank's share again over tp."""
    layout = dist.resolve_layout(
        {"context_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 2}, 8
    )
    assert (layout.context_parallel_size, layout.pipeline_parallel_size) == (2, 2)
    assert layout.data_parallel_size == 2
    layout = dist.resolve_layout(
        {"context_parallel_size": 2, "tensor_parallel_size": 2, "sequence_parallel": True}, 8
    )
    assert layout.sequence_parallel and layout.context_parallel_size == 2
    with pytest.raises(ValueError, match=r"not divisible by .* x context_parallel_size \(2\)"):
        dist.resolve_layout({"context_parallel_size": 2, "pipeline_parallel_size": 2}, 6)


def test_the_gradient_group_is_dp_times_cp_of_the_ranks_pp_and_tp():
    """Every rank of dp2 x cp2 x tp2, played in turn (fake collectives): the ranks holding the
    same parameters and other tokens -- the dp x cp peers with its tp coordinate -- average
    the gradients; its cp peers share its dp and tp coordinates. On a layout without cp the
    gradient group is the dp group."""
    cfg, world = {"context_parallel_size": 2, "tensor_parallel_size": 2}, 8
    for rank in range(world):  # rank = (d * cp + c) * tp + t
        d, c, t = rank // 4, (rank // 2) % 2, rank % 2
        with fake_rank(rank, world):
            util = dist.setup_dist_util(cfg)
            assert (util.data_parallel_rank, util.context_parallel_rank) == (d, c)
            assert util.grad_size == 4
            want = [r for r in range(world) if r % 2 == t]
            assert sorted(torch_dist.get_process_group_ranks(util.grad_group)) == want
            cp_peers = [(d * 2 + cc) * 2 + t for cc in range(2)]
            assert sorted(torch_dist.get_process_group_ranks(util.cp_group)) == cp_peers
    with fake_rank(1, 4):
        util = dist.setup_dist_util({"tensor_parallel_size": 2})
        assert util.grad_group is util.dp_group and util.grad_size == 2
        assert util.cp_group is None


def test_expert_parallel_size_is_a_layout_key():
    """``train.dist.expert_parallel_size`` (default 1) is checked like every size (it must
    divide the dp x cp ranks it borrows) and kept in the layout."""
    assert dist.resolve_layout({"expert_parallel_size": 1}, 4).data_parallel_size == 4
    with pytest.raises(ValueError, match="expert_parallel_size must be a positive integer"):
        dist.resolve_layout({"expert_parallel_size": 0}, 4)
    with pytest.raises(ValueError, match=r"expert_parallel_size=3 must divide .* \(4 x 1 = 4\)"):
        dist.resolve_layout({"expert_parallel_size": 3}, 4)
    layout = dist.resolve_layout({"expert_parallel_size": 2, "tensor_parallel_size": 2}, 8)
    assert (layout.expert_parallel_size, layout.data_parallel_size) == (2, 4)
    assert layout.dims.ep == 2
    layout = dist.resolve_layout({"expert_parallel_size": 4, "context_parallel_size": 2}, 4)
    assert (layout.data_parallel_size, layout.context_parallel_size) == (2, 2)
    with pytest.raises(ValueError, match=r"expert_parallel_size=3 must divide .* \(2 x 2 = 4\)"):
        dist.resolve_layout({"expert_parallel_size": 3, "context_parallel_size": 2}, 4)
