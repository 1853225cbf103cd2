"""Layout validation (no processes needed) and the single-process mesh."""

from __future__ import annotations

import pytest
import torch

from libai import dist
from libai.dist import resolve_layout
from libai.models import GPTForPreTraining


@pytest.mark.parametrize(
    "cfg, world, message",
    [
        ({"tensor_parallel_size": 3}, 8, "not divisible by tensor_parallel_size"),
        (
            {"tensor_parallel_size": 2, "pipeline_parallel_size": 3, "pipeline_num_layers": 6},
            8,
            "x pipeline_parallel_size",
        ),
        (
            {"tensor_parallel_size": 2, "data_parallel_size": 4},
            4,
            "data_parallel_size=4 contradicts",
        ),
        ({"pipeline_parallel_size": 4, "pipeline_num_layers": 2}, 4, "only 2 layers"),
        ({"pipeline_parallel_size": 2}, 2, "pipeline_num_layers must be set"),
        (
            {
                "pipeline_parallel_size": 2,
                "custom_pipeline_stage_id": [0, 1, 1],
                "pipeline_num_layers": 4,
            },
            2,
            "has 3 entries",
        ),
        (
            {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": [0, 1, 2, 1]},
            2,
            "outside [0, 1]",
        ),
        (
            {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": [0, 1, 0, 1]},
            2,
            "non-decreasing",
        ),
        (
            {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": [0, 0, 0, 0]},
            2,
            "leaves stages [1]",
        ),
        ({"tensor_parallel_size": 0}, 1, "positive integer"),
        ({"device_type": "tpu"}, 1, "device_type"),
        ({"virtual_pipeline_size": 2}, 1, "needs pipeline_parallel_size > 1"),
    ],
)
def test_bad_layouts_fail_early_naming_the_key(cfg, world, message):
    with pytest.raises(ValueError, match=None) as info:
        resolve_layout(cfg, world)
    assert message in str(info.value)


def test_unknown_dist_key_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean tensor_parallel_size"):
        resolve_layout({"tensor_parallel_szie": 2}, 2)


def test_even_and_custom_stage_assignment():
    layout = resolve_layout({"pipeline_parallel_size": 2, "pipeline_num_layers": 5}, 4)
    assert layout.layer_stage_ids == (0, 0, 0, 1, 1)
    assert layout.data_parallel_size == 2
    layout = resolve_layout(
        {"pipeline_parallel_size": 2, "custom_pipeline_stage_id": [0, 1, 1, 1]}, 2
    )
    assert layout.layer_stage_ids == (0, 1, 1, 1) and layout.pipeline_num_layers == 4
    layout = resolve_layout(
        {"pipeline_parallel_size": 2, "virtual_pipeline_size": 2, "pipeline_num_layers": 8}, 2
    )
    assert layout.layer_stage_ids == (0, 0, 1, 1, 2, 2, 3, 3) and layout.num_stages == 4
    # data_parallel_size None / -1 / matching are all accepted
    for dp in (None, -1, 2):
        assert (
            resolve_layout(
                {"data_parallel_size": dp, "tensor_parallel_size": 2}, 4
            ).data_parallel_size
            == 2
        )


def test_single_process_mesh_is_trivial():
    util = dist.setup_dist_util({})
    assert util.stage_mesh is None and util.tp_group is None and util.dp_group is None
    assert dist.get_layer_placement(0) is None and dist.get_layer_placement(-1) is None
    assert dist.get_nd_sbp([dist.split(0), dist.broadcast]) == []
    assert dist.get_world_size() == 1 and dist.is_main_process() and dist.is_last_process()
    assert dist.get_tensor_parallel_size() == dist.get_data_parallel_size() == 1
    assert dist.broadcast_py_object({"a": 1}) == {"a": 1}
    t = torch.randn(3)
    assert dist.ttol(t) is t and (dist.tton(t) == t.numpy()).all()
    dist.synchronize()


SMALL_GPT = dict(
    hidden_layers=2,
    vocab_size=50,
    hidden_size=16,
    ffn_hidden_size=32,
    num_attention_heads=2,
    max_seq_length=8,
)


def test_single_process_parameters_are_plain_tensors():
    dist.setup_dist_util({})
    model = GPTForPreTraining(**SMALL_GPT)
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    # the head is tied: one tensor, no copy
    assert model.GPT_model.lm_head.weight is None
    names = [n for n, _ in model.named_parameters()]
    assert not any("lm_head" in n for n in names)


def test_layout_independent_initialization_and_config_typos():
    dist.setup_dist_util({})
    kwargs = SMALL_GPT
    torch.manual_seed(7)
    a = GPTForPreTraining(**kwargs)
    torch.manual_seed(7)
    b = GPTForPreTraining(cfg=kwargs)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    with pytest.raises(ValueError, match="did you mean|Did you mean"):
        GPTForPreTraining(cfg={**kwargs, "hidden_layer": 3})
