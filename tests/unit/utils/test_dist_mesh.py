"""The mesh of every rank of a pp x dp x tp world, checked in one process (the mesh's cp dim,
of size 1 until context parallelism is built, sits between dp and tp).

Each rank of a world of up to 12 processes is played in turn on PyTorch's ``fake`` process
group (collectives are no-ops, groups and meshes are real objects): its coordinate, its
tp / dp / pp / embedding groups, its stage mesh and the placement vocabulary are compared
with the row-major layout written out below (rank = (p * dp + d) * tp + t, tp innermost)
and with hand-computed cases. The 2-process launch (test_dist_utils.py) checks the same
helpers with real communication; here the groups of 3 and 4 ranks show which ranks they hold.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from libai import dist


@contextlib.contextmanager
def no_process_group():
    """No process group and no mesh inside the block, and none after it (the next test that
    needs one builds a world of one, as ``get_dist_util`` does)."""
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    dist.reset_dist_util()
    try:
        yield
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        dist.reset_dist_util()


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int):
    """This process plays ``rank`` of a ``world_size`` world (fake collectives)."""
    with no_process_group():
        torch_dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        yield


def ranks_of(group) -> list[int]:
    return None if group is None else sorted(torch_dist.get_process_group_ranks(group))


def rank_at(p: int, d: int, t: int, dp: int, tp: int) -> int:
    """Row-major ("pp", "dp", "tp") with tp innermost."""
    return (p * dp + d) * tp + t


def coordinate_of(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


# (pp, dp, tp): every dim size distinct from the others somewhere, sizes of 1 included
SHAPES = [(3, 2, 2), (2, 3, 2), (2, 2, 3), (1, 2, 3), (3, 1, 2), (2, 3, 1), (1, 1, 4), (1, 4, 1)]


@pytest.mark.parametrize("pp, dp, tp", SHAPES)
def test_every_rank_gets_the_groups_of_its_row_major_coordinate(pp, dp, tp):
    world = pp * dp * tp
    cfg = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp}
    if pp > 1:
        cfg["pipeline_num_layers"] = 2 * pp
    for rank in range(world):
        p, d, t = coordinate_of(rank, dp, tp)
        with fake_rank(rank, world):
            util = dist.setup_dist_util(dict(cfg))
            assert dist.current_dist_util() is util and dist.get_dist_util() is util
            assert util.rank == rank and util.mesh.mesh_dim_names == ("pp", "dp", "cp", "tp")
            assert util.mesh.mesh.tolist() == [  # cp of size 1 between dp and tp
                [[[rank_at(i, j, k, dp, tp) for k in range(tp)]] for j in range(dp)]
                for i in range(pp)
            ]
            assert (util.pipeline_rank, util.data_parallel_rank, util.tensor_parallel_rank) == (
                p,
                d,
                t,
            )
            assert dist.get_pipeline_parallel_rank() == p
            assert dist.get_data_parallel_rank() == d
            assert dist.get_tensor_parallel_rank() == t
            assert dist.get_pipeline_parallel_size() == pp
            assert dist.get_data_parallel_size() == dp
            assert dist.get_tensor_parallel_size() == tp
            assert dist.get_rank() == rank and dist.get_world_size() == world
            assert dist.is_main_process() == (rank == 0)
            assert dist.is_last_process() == (rank == world - 1)
            tp_peers = [rank_at(p, d, k, dp, tp) for k in range(tp)]
            dp_peers = [rank_at(p, j, t, dp, tp) for j in range(dp)]
            pp_peers = [rank_at(i, d, t, dp, tp) for i in range(pp)]
            assert ranks_of(util.tp_group) == (tp_peers if tp > 1 else None)
            assert ranks_of(util.dp_group) == (dp_peers if dp > 1 else None)
            assert ranks_of(util.pp_group) == (pp_peers if pp > 1 else None)
            # tied embeddings: the first and the last stage at the same (dp, tp) coordinate;
            # a middle stage is in none of these groups
            embedding = [rank_at(0, d, t, dp, tp), rank_at(pp - 1, d, t, dp, tp)]
            in_embedding = pp > 1 and p in (0, pp - 1)
            assert ranks_of(util.embedding_group) == (embedding if in_embedding else None)
            # the stage mesh: this stage's (dp, tp) block, only the dims of size > 1
            dims = tuple(name for name, size in (("dp", dp), ("tp", tp)) if size > 1)
            assert util.stage_dims == dims
            block = [[rank_at(p, j, k, dp, tp) for k in range(tp)] for j in range(dp)]
            if not dims:
                assert util.stage_mesh is None
            else:
                stage = util.stage_mesh
                assert stage.mesh_dim_names == dims
                flat = sorted(r for row in block for r in row)
                assert sorted(stage.mesh.flatten().tolist()) == flat
                assert list(stage.mesh.shape) == [{"dp": dp, "tp": tp}[n] for n in dims]
            assert util.device == torch.device("cpu")
            assert util.layout.world_size == world


def test_placement_vocabulary_on_a_dp_tp_pp_mesh():
    # rank 6 of pp=2 x dp=2 x tp=2: coordinate (1, 1, 0), stage 1 holds layers 2 and 3
    with fake_rank(6, 8):
        cfg = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 4}
        util = dist.setup_dist_util(cfg)
        dp_sbp, tp_sbp = Shard(0), Shard(1)
        assert dist.get_nd_sbp([dp_sbp, tp_sbp]) == [Shard(0), Shard(1)]
        assert dist.get_hidden_sbp() == [Shard(0), Replicate()]
        assert dist.split(2) == Shard(2) and dist.broadcast == Replicate()
        with pytest.raises(ValueError, match="takes"):
            dist.get_nd_sbp([dp_sbp])
        with pytest.raises(ValueError, match="takes"):
            dist.get_nd_sbp([dp_sbp, tp_sbp, tp_sbp])
        assert [util.is_layer_local(i) for i in range(4)] == [False, False, True, True]
        assert util.is_layer_local(-1) and not util.is_layer_local(-4)
        assert dist.get_layer_placement(2) is util.stage_mesh
        assert dist.get_layer_placement(-1) is util.stage_mesh
        with pytest.raises(ValueError, match="belongs to pipeline stage 0"):
            dist.get_layer_placement(1)
        assert util.local_stages() == [1]
        assert [util.get_layer_stage(i) for i in (0, 1, 2, 3, -1, -2, -3, -4)] == [
            0,
            0,
            1,
            1,
            1,
            1,
            0,
            0,
        ]
        # libai's own message (Python's "tuple index out of range" would not name the count)
        for bad, shown in ((4, 4), (5, 5), (-5, -1)):
            with pytest.raises(IndexError, match=rf"layer_idx {shown} out of range for 4 pipe"):
                util.get_layer_stage(bad)
        # the resolved layout is written back into the caller's mapping
        assert cfg["data_parallel_size"] == 2
        assert cfg["custom_pipeline_stage_id"] == [0, 0, 1, 1]
        assert cfg["pipeline_num_layers"] == 4


def test_one_dim_meshes_keep_only_their_dim():
    with fake_rank(1, 2):
        dist.setup_dist_util({"tensor_parallel_size": 2})
        assert dist.get_nd_sbp([Shard(0), Shard(1)]) == [Shard(1)]
        assert dist.get_hidden_sbp() == [Replicate()]
    with fake_rank(1, 2):
        dist.setup_dist_util({})
        assert dist.get_nd_sbp([Shard(0), Shard(1)]) == [Shard(0)]
        assert dist.get_hidden_sbp() == [Shard(0)]


def test_interleaved_stages_of_each_pipeline_rank():
    # pp=3 x vpp=2: six virtual stages, 12 layers two per stage; pipeline rank r holds
    # stages r and r + 3
    cfg = {"pipeline_parallel_size": 3, "virtual_pipeline_size": 2, "pipeline_num_layers": 12}
    expected_stages = {0: [0, 3], 1: [1, 4], 2: [2, 5]}
    for rank in range(3):
        with fake_rank(rank, 3):
            util = dist.setup_dist_util(dict(cfg))
            assert util.local_stages() == expected_stages[rank]
            assert [util.stage_to_pipeline_rank(s) for s in range(6)] == [0, 1, 2, 0, 1, 2]
            local = [i for i in range(12) if util.is_layer_local(i)]
            assert local == [i for i in range(12) if (i // 2) % 3 == rank]
            assert dist.get_layer_placement(local[-1]) is None  # the stage is one process
            other = next(i for i in range(12) if i not in local)
            with pytest.raises(ValueError, match="belongs to pipeline stage"):
                dist.get_layer_placement(other)


def test_without_a_pipeline_every_layer_is_stage_zero():
    with fake_rank(0, 2):
        util = dist.setup_dist_util({"tensor_parallel_size": 2})
        assert util.layout.layer_stage_ids == ()
        assert [util.get_layer_stage(i) for i in (0, 7, 1000, -3)] == [0, 0, 0, 0]
        assert util.local_stages() == [0] and util.is_layer_local(99)


def test_setup_without_a_stage_split_leaves_the_config_alone():
    cfg = {"tensor_parallel_size": 2}
    with fake_rank(0, 4):
        dist.setup_dist_util(cfg)
        assert dist.get_data_parallel_size() == 2
    assert cfg == {"tensor_parallel_size": 2}


def test_setup_records_into_a_mapping_only_and_tolerates_read_only_ones():
    from types import MappingProxyType, SimpleNamespace

    ns = SimpleNamespace(pipeline_parallel_size=2, pipeline_num_layers=2)
    with fake_rank(0, 2):
        util = dist.setup_dist_util(ns)
        assert util.layout.layer_stage_ids == (0, 1)
    assert vars(ns) == {"pipeline_parallel_size": 2, "pipeline_num_layers": 2}
    frozen = MappingProxyType({"pipeline_parallel_size": 2, "pipeline_num_layers": 2})
    with fake_rank(1, 2):
        util = dist.setup_dist_util(frozen)
        assert util.layout.layer_stage_ids == (0, 1) and util.pipeline_rank == 1


def test_recorded_layout_with_custom_stage_ids():
    cfg = {
        "pipeline_parallel_size": 2,
        "tensor_parallel_size": 2,
        "custom_pipeline_stage_id": [0, 1, 1],
        "data_parallel_size": None,
    }
    with fake_rank(5, 12):
        util = dist.setup_dist_util(cfg)
        assert (util.pipeline_rank, util.data_parallel_rank, util.tensor_parallel_rank) == (
            0,
            2,
            1,
        )
    assert cfg == {
        "pipeline_parallel_size": 2,
        "tensor_parallel_size": 2,
        "custom_pipeline_stage_id": [0, 1, 1],
        "data_parallel_size": 3,
        "pipeline_num_layers": 3,
    }


def test_setup_validates_against_the_launch_world_before_any_group(monkeypatch):
    with no_process_group():
        monkeypatch.setenv("WORLD_SIZE", "6")
        with pytest.raises(ValueError, match=r"world size \(6 processes\)"):
            dist.setup_dist_util({"tensor_parallel_size": 4})
        assert not torch_dist.is_initialized()
        monkeypatch.delenv("WORLD_SIZE")
        with pytest.raises(ValueError, match=r"world size \(1 processes\)"):
            dist.setup_dist_util({"tensor_parallel_size": 2})
        assert not torch_dist.is_initialized()
    # an existing process group's world wins over the environment
    with fake_rank(0, 4):
        monkeypatch.setenv("WORLD_SIZE", "1")
        assert dist.setup_dist_util({"tensor_parallel_size": 2}).layout.data_parallel_size == 2


# ---- the process group --------------------------------------------------------------------------
def test_plain_python_is_a_gloo_world_of_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with no_process_group():
        assert dist.current_dist_util() is None
        assert dist.get_rank() == 0 and dist.get_world_size() == 1
        util = dist.get_dist_util()  # built on first use
        assert util is dist.current_dist_util() and util is dist.get_dist_util()
        assert torch_dist.is_initialized() and torch_dist.get_backend() == "gloo"
        assert torch_dist.get_world_size() == 1 and util.layout.world_size == 1


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))


@pytest.fixture
def init_calls(monkeypatch):
    """``torch.distributed.init_process_group`` and ``torch.cuda.set_device`` recorded."""
    init, set_device = Recorder(), Recorder()
    monkeypatch.setattr(torch_dist, "init_process_group", init)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    for name in ("WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with no_process_group():
        yield init.calls, set_device.calls


def test_init_under_torchrun_uses_the_environment(init_calls, monkeypatch):
    init, set_device = init_calls
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist._init_process_group("cpu")
    from datetime import timedelta

    assert init == [(("gloo",), {"timeout": timedelta(minutes=10)})] and set_device == []
    monkeypatch.setenv("LOCAL_RANK", "3")
    dist._init_process_group("cuda")
    assert init[1] == (("nccl",), {"timeout": timedelta(minutes=10)})
    assert set_device == [((3,), {})]
    monkeypatch.delenv("LOCAL_RANK")
    dist._init_process_group("cuda")
    assert set_device[1] == ((0,), {})


@pytest.mark.parametrize("env", [{}, {"WORLD_SIZE": "1"}, {"MASTER_ADDR": "127.0.0.1"}])
def test_init_without_a_launcher_is_a_hash_store_world_of_one(init_calls, monkeypatch, env):
    init, set_device = init_calls
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dist._init_process_group("cpu")
    dist._init_process_group("cuda")
    assert [args for args, _ in init] == [("gloo",), ("nccl",)]
    for _, kwargs in init:
        assert set(kwargs) == {"store", "rank", "world_size"}
        assert isinstance(kwargs["store"], torch_dist.HashStore)
        assert kwargs["rank"] == 0 and kwargs["world_size"] == 1
    assert set_device == []


def test_init_keeps_an_existing_process_group(monkeypatch):
    init = Recorder()
    with fake_rank(1, 2):
        monkeypatch.setattr(torch_dist, "init_process_group", init)
        dist._init_process_group("cpu")
        assert init.calls == [] and torch_dist.get_world_size() == 2


def test_cuda_layout_uses_the_current_device(monkeypatch):
    import dataclasses

    with fake_rank(0, 2):
        util = dist.setup_dist_util({"tensor_parallel_size": 2})
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
        cuda_layout = dataclasses.replace(util.layout, device_type="cuda")
        assert dist.DistUtil(cuda_layout, util.mesh).device == torch.device("cuda", 5)
        assert dist.DistUtil(util.layout, util.mesh).device == torch.device("cpu")


def test_setup_builds_a_cuda_mesh_for_a_cuda_layout(monkeypatch):
    # the CPU stands in for the GPU: what matters is the device type asked for
    from libai.dist import parallel_dims

    calls = []
    real_init_device_mesh = parallel_dims.init_device_mesh

    def init_device_mesh(device_type, shape, **kwargs):
        calls.append(("mesh", device_type, tuple(shape), kwargs))
        return real_init_device_mesh("cpu", shape, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(parallel_dims, "init_device_mesh", init_device_mesh)
    monkeypatch.setattr(dist, "_init_process_group", lambda kind: calls.append(("init", kind)))
    with fake_rank(3, 4):
        util = dist.setup_dist_util({"device_type": "cuda", "tensor_parallel_size": 2})
        assert calls == [
            ("init", "cuda"),
            ("mesh", "cuda", (1, 2, 1, 2), {"mesh_dim_names": ("pp", "dp", "cp", "tp")}),
        ]
        assert util.device == torch.device("cuda", 1) and util.layout.device_type == "cuda"


class ItemConfig:
    """Not a mapping, but it takes item assignment (and ``vars`` gives its keys)."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __setitem__(self, key, value):
        self.__dict__[key] = value


def test_only_a_mapping_gets_the_resolved_layout_written_back():
    cfg = ItemConfig(pipeline_parallel_size=2, pipeline_num_layers=4)
    with fake_rank(0, 2):
        assert dist.setup_dist_util(cfg).layout.layer_stage_ids == (0, 0, 1, 1)
    assert vars(cfg) == {"pipeline_parallel_size": 2, "pipeline_num_layers": 4}


def test_destroy_and_synchronize_barrier_only_with_peers(monkeypatch):
    barriers = Recorder()
    with fake_rank(1, 2):
        monkeypatch.setattr(torch_dist, "barrier", barriers)
        dist.setup_dist_util({})
        dist.synchronize()
        assert len(barriers.calls) == 1
        dist.destroy_dist()
        assert len(barriers.calls) == 2
        assert not torch_dist.is_initialized() and dist.current_dist_util() is None
    with no_process_group():
        dist.synchronize()  # no process group: nothing to wait for
        dist.get_dist_util()
        dist.synchronize()
        assert len(barriers.calls) == 2
        dist.destroy_dist()
        assert len(barriers.calls) == 2
        assert not torch_dist.is_initialized() and dist.current_dist_util() is None
        dist.destroy_dist()  # twice is fine


def test_broadcast_py_object_of_one_process_is_the_object_itself():
    obj = {"a": [1, 2]}
    with no_process_group():
        assert dist.broadcast_py_object(obj) is obj
        dist.get_dist_util()
        assert dist.broadcast_py_object(obj) is obj
        assert dist.broadcast_py_object(obj, src=0) is obj


def test_ttol_and_tton_on_listed_ranks():
    t = torch.arange(6.0, requires_grad=True)
    with fake_rank(3, 4):
        assert dist.ttol(t) is t and dist.ttol(t, ranks=[0, 3]) is t
        assert dist.ttol(t, ranks=[0, 1]) is None and dist.tton(t, ranks=[2]) is None
        out = dist.tton(t, ranks=(3,))
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    with no_process_group():
        assert dist.ttol(t, ranks=[0]) is t and dist.ttol(t, ranks=[1]) is None
        assert dist.tton(t).tolist() == t.tolist()


def test_rank_helpers_without_a_process_group(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with no_process_group():
        assert dist.get_rank() == 0 and dist.get_world_size() == 1
        assert dist.is_main_process() and dist.is_last_process()
        assert dist.get_local_rank() == 0
        monkeypatch.setenv("LOCAL_RANK", "3")
        assert dist.get_local_rank() == 3


def test_use_dist_util_restores_the_previous_one():
    from types import SimpleNamespace

    outer, inner = SimpleNamespace(name="outer"), SimpleNamespace(name="inner")
    with no_process_group():
        with dist.use_dist_util(outer) as got:
            assert got is outer and dist.current_dist_util() is outer
            with pytest.raises(RuntimeError):
                with dist.use_dist_util(inner):
                    assert dist.get_dist_util() is inner
                    raise RuntimeError("boom")
            assert dist.current_dist_util() is outer
        assert dist.current_dist_util() is None
        with dist.use_dist_util(outer):
            dist.reset_dist_util()
            assert dist.current_dist_util() is None


def test_model_layer_count_must_match_the_stage_split():
    from types import SimpleNamespace

    split = dist.resolve_layout({"pipeline_parallel_size": 2, "pipeline_num_layers": 4}, 2)
    with dist.use_dist_util(SimpleNamespace(layout=split)):
        dist.check_model_num_layers(4, "hidden_layers=4")
        with pytest.raises(ValueError, match="pipeline_num_layers=4 but the model has layers=3"):
            dist.check_model_num_layers(3, "layers=3")
    with dist.use_dist_util(SimpleNamespace(layout=dist.resolve_layout({}, 1))):
        dist.check_model_num_layers(3, "layers=3")  # no stage split: any count


def test_all_shapes_are_distinct():
    # guard of the table above: the coordinates are a bijection for every shape
    for pp, dp, tp in SHAPES:
        coords = [coordinate_of(r, dp, tp) for r in range(pp * dp * tp)]
        assert sorted(coords) == list(itertools.product(range(pp), range(dp), range(tp)))
        assert [rank_at(*c, dp, tp) for c in coords] == list(range(pp * dp * tp))
