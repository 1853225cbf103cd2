"""``train.dist`` resolution (every key, away from its default) and how the command-line
tools end (``libai.dist.cli.run_cli``); no process group needed.

The expected layouts are written out by hand: LiBai's even split gives layer ``i`` of ``L``
to stage ``floor(i * S / L)`` of ``S``.
"""

from __future__ import annotations

import io
import sys
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest
import torch

from libai import dist
from libai.dist import DistLayout, cli, dist_config_items, resolve_layout
from libai.utils.errors import OneLineError


# ---- the keys ------------------------------------------------------------------------------------
def test_config_items_of_mappings_namespaces_and_none():
    assert dist_config_items(None) == {}
    cfg = {"tensor_parallel_size": 2, "pipeline_schedule": "GPipe"}
    assert dist_config_items(cfg) == cfg and dist_config_items(cfg) is not cfg
    assert dist_config_items(MappingProxyType(cfg)) == cfg
    ns = SimpleNamespace(tensor_parallel_size=2, _private="ignored", __also="ignored")
    assert dist_config_items(ns) == {"tensor_parallel_size": 2}
    # a namespace's keys are checked like a mapping's
    with pytest.raises(ValueError, match="'pipeline_parallel_szie'"):
        dist_config_items(SimpleNamespace(pipeline_parallel_szie=2))


def test_unknown_keys_name_at_most_two_close_matches():
    with pytest.raises(ValueError) as info:
        dist_config_items({"parallel_size": 2, "zzz": 1, "device": "cpu"})
    message = str(info.value)
    assert message.startswith(
        "Unknown key(s) in train.dist: 'parallel_size' (did you mean data_parallel_size or "
        "tensor_parallel_size?), 'zzz', 'device' (did you mean device_type?). Valid keys: "
    )
    assert "pipeline_parallel_size?" not in message  # the third close match is left out
    with pytest.raises(
        ValueError, match=r"train.dist: 'zzz'\. Valid keys: context_parallel_size, cu"
    ):
        dist_config_items({"zzz": 1, "tensor_parallel_size": 2})


# ---- positive integers -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key", ["tensor_parallel_size", "pipeline_parallel_size", "virtual_pipeline_size"]
)
@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "2", None])
def test_sizes_must_be_positive_integers_naming_the_key(key, bad):
    cfg = {"pipeline_parallel_size": 2, "pipeline_num_layers": 4, key: bad}
    with pytest.raises(ValueError, match=rf"^train\.dist\.{key} must be a positive integer"):
        resolve_layout(cfg, 8)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4"])
def test_pipeline_num_layers_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"^train\.dist\.pipeline_num_layers must be a positive"):
        resolve_layout({"pipeline_num_layers": bad}, 1)


def test_numpy_integers_and_one_are_accepted_as_python_ints():
    layout = resolve_layout(
        {
            "tensor_parallel_size": np.int64(2),
            "pipeline_parallel_size": np.int32(2),
            "virtual_pipeline_size": np.int64(1),
            "pipeline_num_layers": np.int64(2),
        },
        4,
    )
    sizes = (layout.tensor_parallel_size, layout.pipeline_parallel_size)
    assert sizes == (2, 2) and all(type(s) is int for s in sizes)
    assert type(layout.pipeline_num_layers) is int and layout.pipeline_num_layers == 2
    assert type(layout.data_parallel_size) is int and layout.data_parallel_size == 1
    assert resolve_layout({"tensor_parallel_size": 1, "pipeline_parallel_size": 1}, 1) == (
        DistLayout(1, 1, 1, 1)
    )


# ---- every key reaches the layout ----------------------------------------------------------------
def test_every_key_away_from_its_default_reaches_the_layout(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    layout = resolve_layout(
        {
            "data_parallel_size": 3,
            "tensor_parallel_size": 2,
            "pipeline_parallel_size": 2,
            "virtual_pipeline_size": 2,
            "pipeline_num_layers": 6,
            "device_type": "cuda",
            "pipeline_schedule": "Interleaved1F1B",
            "sequence_parallel": True,
        },
        12,
    )
    assert layout == DistLayout(
        world_size=12,
        data_parallel_size=3,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        virtual_pipeline_size=2,
        pipeline_num_layers=6,
        # 6 layers over 4 virtual stages: floor(i * 4 / 6)
        layer_stage_ids=(0, 0, 1, 2, 2, 3),
        device_type="cuda",
        pipeline_schedule="Interleaved1F1B",
        sequence_parallel=True,
    )
    assert layout.num_stages == 4


def test_defaults_of_an_empty_config():
    assert resolve_layout({}, 3) == DistLayout(
        world_size=3,
        data_parallel_size=3,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        virtual_pipeline_size=1,
        pipeline_num_layers=None,
        layer_stage_ids=(),
        device_type="cpu",
        pipeline_schedule="1F1B",
        sequence_parallel=False,
    )
    assert resolve_layout(None, 2).data_parallel_size == 2


def test_cuda_needs_a_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device is available"):
        resolve_layout({"device_type": "cuda"}, 1)
    assert resolve_layout({"device_type": "cpu"}, 1).device_type == "cpu"
    for bad in ("CPU", "gpu", "Cuda"):
        with pytest.raises(ValueError, match="must be 'cpu' or 'cuda'"):
            resolve_layout({"device_type": bad}, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_layout({"device_type": "cuda"}, 1).device_type == "cuda"


# ---- the world and the data-parallel size -----------------------------------------------------------
@pytest.mark.parametrize(
    "tp, pp, world",
    [(2, 2, 6), (2, 1, 5), (3, 1, 7), (2, 3, 8), (4, 1, 2), (1, 2, 3)],
)
def test_a_world_that_tp_x_pp_does_not_divide_is_refused(tp, pp, world):
    cfg = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "pipeline_num_layers": 8}
    with pytest.raises(ValueError, match=rf"world size \({world} processes\) is not divisible"):
        resolve_layout(cfg, world)


@pytest.mark.parametrize(
    "tp, pp, world, dp", [(2, 2, 8, 2), (1, 2, 6, 3), (3, 1, 6, 2), (2, 3, 12, 2), (1, 1, 5, 5)]
)
def test_data_parallel_size_is_world_over_tp_x_pp(tp, pp, world, dp):
    cfg = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "pipeline_num_layers": 8}
    layout = resolve_layout(cfg, world)
    assert layout.data_parallel_size == dp and type(layout.data_parallel_size) is int
    for configured in (None, -1, "auto", dp, str(dp)):
        assert resolve_layout({**cfg, "data_parallel_size": configured}, world) == layout


@pytest.mark.parametrize("configured", [1, 3, 4, -2, "1"])
def test_a_data_parallel_size_that_contradicts_the_launch_is_refused(configured):
    # world 4 / tp 2 = dp 2
    with pytest.raises(ValueError, match=f"data_parallel_size={configured} contradicts"):
        resolve_layout({"tensor_parallel_size": 2, "data_parallel_size": configured}, 4)


# ---- pipeline stages -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "layers, pp, vpp, expected",
    [
        (2, 2, 1, (0, 1)),  # as many layers as stages
        (4, 4, 1, (0, 1, 2, 3)),
        (7, 3, 1, (0, 0, 0, 1, 1, 2, 2)),
        (5, 2, 1, (0, 0, 0, 1, 1)),
        (10, 4, 1, (0, 0, 0, 1, 1, 2, 2, 2, 3, 3)),
        (6, 2, 2, (0, 0, 1, 2, 2, 3)),
        (6, 3, 2, (0, 1, 2, 3, 4, 5)),
        (3, 1, 1, (0, 0, 0)),  # one stage: every layer on it
    ],
)
def test_even_stage_split(layers, pp, vpp, expected):
    layout = resolve_layout(
        {"pipeline_parallel_size": pp, "virtual_pipeline_size": vpp, "pipeline_num_layers": layers},
        pp,
    )
    assert layout.layer_stage_ids == expected
    assert all(type(s) is int for s in layout.layer_stage_ids)
    assert layout.pipeline_num_layers == layers and layout.num_stages == pp * vpp


def test_fewer_layers_than_stages_are_refused():
    with pytest.raises(ValueError, match="only 3 layers"):
        resolve_layout(
            {"pipeline_parallel_size": 2, "virtual_pipeline_size": 2, "pipeline_num_layers": 3}, 2
        )


def test_virtual_stages_need_a_pipeline():
    for vpp in (2, 3):
        with pytest.raises(ValueError, match="needs pipeline_parallel_size > 1"):
            resolve_layout({"virtual_pipeline_size": vpp, "pipeline_num_layers": 4}, 1)
    layout = resolve_layout({"virtual_pipeline_size": 1, "pipeline_num_layers": 4}, 1)
    assert layout.virtual_pipeline_size == 1


def test_a_stage_split_needs_the_number_of_layers():
    for pp, vpp in ((2, 1), (3, 1), (2, 2)):
        cfg = {"pipeline_parallel_size": pp, "virtual_pipeline_size": vpp}
        with pytest.raises(ValueError, match="pipeline_num_layers must be set"):
            resolve_layout(cfg, pp)


@pytest.mark.parametrize(
    "ids, pp, vpp",
    [
        ([0, 0, 1, 1, 1], 2, 1),
        ([0, 1], 2, 1),
        (["0", "1", "1"], 2, 1),  # ids from a YAML or the command line
        ([0, 1, 1, 2, 3, 3], 2, 2),
        ([0, 0, 1, 2], 3, 1),
    ],
)
def test_custom_stage_ids_are_kept(ids, pp, vpp):
    cfg = {"pipeline_parallel_size": pp, "virtual_pipeline_size": vpp}
    layout = resolve_layout({**cfg, "custom_pipeline_stage_id": ids}, pp)
    assert layout.layer_stage_ids == tuple(int(s) for s in ids)
    assert layout.pipeline_num_layers == len(ids)
    # with pipeline_num_layers given, it must agree
    layout = resolve_layout(
        {**cfg, "custom_pipeline_stage_id": ids, "pipeline_num_layers": len(ids)}, pp
    )
    assert layout.layer_stage_ids == tuple(int(s) for s in ids)


@pytest.mark.parametrize(
    "ids, layers, message",
    [
        ([0, 1, 1], 4, "has 3 entries but the model has 4 layers"),
        ([0, 1, 1, 1, 1], 4, "has 5 entries but the model has 4 layers"),
        ([-1, 0, 1], None, "stage ids [-1] outside [0, 1]"),
        ([0, 1, 2], None, "stage ids [2] outside [0, 1]"),
        ([0, 1, 1, 0], None, "must be non-decreasing"),
        ([0, 1, 0, 1], None, "must be non-decreasing"),
        ([0, 0, 1, 0], None, "must be non-decreasing"),
        ([1, 1, 1], None, "leaves stages [0] without layers"),
        ([0, 0], None, "leaves stages [1] without layers"),
    ],
)
def test_bad_custom_stage_ids(ids, layers, message):
    cfg = {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": ids}
    if layers is not None:
        cfg["pipeline_num_layers"] = layers
    with pytest.raises(ValueError) as info:
        resolve_layout(cfg, 2)
    assert message in str(info.value)


def test_custom_stage_ids_with_virtual_stages_leave_none_empty():
    cfg = {"pipeline_parallel_size": 2, "virtual_pipeline_size": 2}
    with pytest.raises(ValueError, match=r"leaves stages \[1, 3\]"):
        resolve_layout({**cfg, "custom_pipeline_stage_id": [0, 2, 2]}, 2)
    with pytest.raises(ValueError, match=r"outside \[0, 3\]"):
        resolve_layout({**cfg, "custom_pipeline_stage_id": [0, 1, 2, 3, 4]}, 2)


# ---- sequence parallel -----------------------------------------------------------------------------
def test_sequence_parallel_needs_tensor_parallel():
    with pytest.raises(ValueError, match="sequence_parallel=True needs tensor_parallel_size > 1"):
        resolve_layout({"sequence_parallel": True}, 2)
    for tp in (2, 3):
        layout = resolve_layout({"sequence_parallel": True, "tensor_parallel_size": tp}, 6)
        assert layout.sequence_parallel is True
    layout = resolve_layout({"sequence_parallel": np.bool_(True), "tensor_parallel_size": 2}, 2)
    assert layout.sequence_parallel is True
    assert resolve_layout({"sequence_parallel": False, "tensor_parallel_size": 2}, 2) == (
        resolve_layout({"tensor_parallel_size": 2}, 2)
    )
    assert resolve_layout({"sequence_parallel": np.bool_(False)}, 1).sequence_parallel is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="sequence_parallel must be True or False"):
            resolve_layout({"sequence_parallel": bad, "tensor_parallel_size": 2}, 2)


# ---- the command-line tools' ending ------------------------------------------------------------------
class FlushCounter(io.StringIO):
    def __init__(self):
        super().__init__()
        self.flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


@pytest.fixture
def cli_run(monkeypatch):
    """Run ``run_cli(main)``: (exit code, stderr text, stderr flushes, destroy calls)."""
    destroyed = []
    monkeypatch.setattr(dist, "destroy_dist", lambda: destroyed.append(True))

    def run(main):
        err = FlushCounter()
        monkeypatch.setattr(sys, "stderr", err)
        with pytest.raises(SystemExit) as info:
            cli.run_cli(main)
        return info.value.code, err.getvalue(), err.flushes, len(destroyed)

    return run


def test_success_exits_zero_after_tearing_down(cli_run, capsys):
    assert cli_run(lambda: 0) == (0, "", 0, 1)
    assert capsys.readouterr().out == ""


def test_a_failure_code_is_kept_and_nothing_is_torn_down(cli_run):
    assert cli_run(lambda: 3) == (3, "", 0, 0)
    assert cli_run(lambda: 1) == (1, "", 0, 0)
    assert cli_run(lambda: 0) == (0, "", 0, 1)


class BadKey(OneLineError):
    pass


@pytest.mark.parametrize(
    "exc, name",
    [
        (ValueError("train.dist.tensor_parallel_size must be 2"), "ValueError"),
        (FileNotFoundError("no such config"), "FileNotFoundError"),
        (KeyError("model.cfg.x"), "KeyError"),
        (NotImplementedError("no fp8 on cpu"), "NotImplementedError"),
        (BadKey("checkpoint /x is unsafe"), "BadKey"),
    ],
)
def test_bad_input_is_one_flushed_line_on_stderr_and_exit_one(cli_run, capsys, exc, name):
    def main():
        raise exc

    code, err, flushes, destroyed = cli_run(main)
    assert (code, destroyed) == (1, 0)
    assert err == f"error: {name}: {exc}\n"
    assert flushes >= 1
    assert capsys.readouterr().out == ""


def test_other_errors_keep_their_traceback(monkeypatch):
    destroyed = []
    monkeypatch.setattr(dist, "destroy_dist", lambda: destroyed.append(True))

    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        cli.run_cli(main)
    assert destroyed == []
