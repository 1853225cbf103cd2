"""``create_parameter`` against values and shapes written out in the test, in one process.

A parameter's value is compared with ``init_method`` run by hand on a CPU tensor of the
requested dtype with a generator seeded by the parameter's seed (the seed being the next draw
of the global CPU RNG, computed here from ``torch.manual_seed``); a tied copy built from
``libai_init_seed`` with the original. Pipeline and tensor-parallel ranks are played by the
memory estimator's stand-in mesh (no process group; its device is ``meta``): another stage's
parameter is a ``meta`` tensor of the tp-local shape, an own-stage one lands on the mesh's
device.
"""

from __future__ import annotations

import pytest
import torch
from layer_helpers import single_process  # noqa: F401 (single_process: an autouse fixture)
from torch import nn

from libai import dist
from libai.layers.param import create_parameter, init_method_normal
from libai.runtime.memory_estimator import CountingDistUtil

INIT = init_method_normal(0.5)


def next_seed(torch_seed: int) -> int:
    """The seed ``create_parameter`` draws first after ``torch.manual_seed(torch_seed)``."""
    torch.manual_seed(torch_seed)
    return int(torch.randint(0, 2**62, (1,), device="cpu").item())


def expected_value(shape, seed: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return nn.init.normal_(torch.empty(shape, dtype=dtype), 0.0, 0.5, generator=generator)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_value_is_drawn_in_the_requested_dtype(dtype):
    """Without padding the parameter is ``init_method`` on a tensor of ``dtype`` (not a
    float32 draw): its dtype and every value equal the hand-made draw."""
    seed = next_seed(3)
    torch.manual_seed(3)
    param = create_parameter((3, 5), INIT, layer_idx=0, dtype=dtype)
    assert param.libai_init_seed == seed
    want = expected_value((3, 5), seed, dtype)
    assert param.dtype == dtype
    assert torch.equal(param.detach(), want)


def test_tied_copy_from_the_recorded_seed_starts_equal():
    """``libai_init_seed`` is the seed the value came from: a copy created with it (the tied
    head on another stage) equals the original, although the global RNG moved on."""
    torch.manual_seed(11)
    first = create_parameter((4, 6), INIT, layer_idx=0)
    other = create_parameter((4, 6), INIT, layer_idx=0)  # a fresh seed: a different value
    tied = create_parameter((4, 6), INIT, layer_idx=0, seed=first.libai_init_seed)
    assert first.libai_init_seed == next_seed(11)
    assert torch.equal(tied.detach(), first.detach())
    assert not torch.equal(other.detach(), first.detach())
    assert tied.libai_init_seed == first.libai_init_seed


@pytest.mark.parametrize(
    ("tp", "tp_split_dim", "local_shape"), [(1, None, (8, 6)), (2, 0, (4, 6)), (2, 1, (8, 3))]
)
def test_parameter_of_another_stage_is_meta_with_the_local_shape(tp, tp_split_dim, local_shape):
    """Rank (pp 0) of a pp=2 layout: layer 1 lives on stage 1, so its parameter takes no
    memory (``meta``) and has this tp rank's shard shape; the full shape is recorded."""
    layout = dist.resolve_layout(
        {"pipeline_parallel_size": 2, "pipeline_num_layers": 2, "tensor_parallel_size": tp},
        2 * tp,
    )
    with dist.use_dist_util(CountingDistUtil(layout, 0)):
        param = create_parameter((8, 6), INIT, layer_idx=1, tp_split_dim=tp_split_dim)
    assert param.device.type == "meta"
    assert tuple(param.shape) == local_shape
    assert param.libai_global_shape == (8, 6)


def test_own_stage_parameter_lands_on_the_mesh_device():
    """A parameter of this rank's stage is moved to the mesh's device (``meta`` for the
    stand-in mesh), with the full (tp=1) shape."""
    layout = dist.resolve_layout({"pipeline_parallel_size": 2, "pipeline_num_layers": 2}, 2)
    util = CountingDistUtil(layout, 0)
    with dist.use_dist_util(util):
        param = create_parameter((8, 6), INIT, layer_idx=0)
        padded = create_parameter((7, 6), INIT, layer_idx=0, padded_shape=(8, 6))
    assert util.device.type == "meta"
    assert param.device == util.device and tuple(param.shape) == (8, 6)
    assert padded.device == util.device and tuple(padded.shape) == (8, 6)


def test_padding_is_zero_and_the_rest_is_the_unpadded_draw():
    """``padded_shape`` rows after the logical ones are zero; the logical ones are the draw of
    the logical shape (the padding never touches the RNG stream)."""
    seed = next_seed(5)
    torch.manual_seed(5)
    param = create_parameter((7, 6), INIT, layer_idx=0, padded_shape=(8, 6))
    assert tuple(param.shape) == (8, 6) and param.libai_logical_shape == (7, 6)
    assert torch.equal(param.detach()[:7], expected_value((7, 6), seed, torch.float32))
    assert torch.equal(param.detach()[7:], torch.zeros(1, 6))
