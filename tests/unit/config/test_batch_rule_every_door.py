"""One batch rule for every door: LiBai's ``train`` keys, FleetX's ``Global`` /
``Engine.accumulate_steps`` and Rapidformer's flags resolve the same sizes to the same
(micro, global, accumulation) -- or all refuse them -- by ``libai.config.resolve``'s rule,
checked here against the formula ``global = micro x data-parallel ranks x accumulation``."""

from __future__ import annotations

import itertools

import pytest
from engine_helpers import SIMPLE_NET
from omegaconf import OmegaConf

from libai.accelerate.arguments import FLAGS
from libai.config.resolve import batch_sizes, resolve_batch_sizes
from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config, resolve_batch_config

SIZES = (None, 2, 4, 6, 8, 12)
CASES = [
    (micro, glob, acc, dp)
    for micro, glob, acc, dp in itertools.product(SIZES, SIZES, (None, 1, 2, 3), (1, 2, 3))
    if micro is not None or glob is not None
]


def formula(micro, glob, acc, dp):
    """What the rule must give, written out: None when no sizes fit the given ones."""
    for m, a in itertools.product(range(1, 13), range(1, 13)):
        if micro not in (None, m) or acc not in (None, a):
            continue
        g = m * dp * a
        if glob not in (None, g):
            continue
        # what is derived: accumulation 1 unless the others force it
        if acc is None and not (micro is not None and glob is not None) and a != 1:
            continue
        return m, g, a
    return None


def fleetx(micro, glob, acc, dp):
    overrides = [
        f"Global.micro_batch_size={'null' if micro is None else micro}",
        f"Global.global_batch_size={'null' if glob is None else glob}",
        f"Engine.accumulate_steps={'null' if acc is None else acc}",
    ]
    try:
        cfg = resolve_batch_config(load_yaml_config(SIMPLE_NET, overrides), dp)
    except YAMLConfigError:
        return None
    g = cfg.Global
    assert g.local_batch_size * dp == g.global_batch_size
    return g.micro_batch_size, g.global_batch_size, cfg.Engine.accumulate_steps


def libai(micro, glob, acc, dp):
    train = {"train_micro_batch_size": micro, "global_batch_size": glob}
    train["num_accumulation_steps"] = acc
    try:
        return tuple(resolve_batch_sizes(OmegaConf.create(train), dp))
    except ValueError:
        return None


@pytest.mark.parametrize("micro, glob, acc, dp", CASES)
def test_libai_and_fleetx_resolve_the_same_sizes_as_the_formula(micro, glob, acc, dp):
    want = formula(micro, glob, acc, dp)
    assert libai(micro, glob, acc, dp) == want
    assert fleetx(micro, glob, acc, dp) == want


@pytest.mark.parametrize("micro, glob, dp", [(4, None, 2), (4, 8, 2), (4, 16, 2), (4, 12, 2)])
def test_the_rule_under_rapidformer_flag_names(micro, glob, dp):
    """Rapidformer's door calls the rule with its flag names and no accumulation flag (it
    is derived): the sizes of the formula, the error in the flags' words."""
    want = formula(micro, glob, None, dp)
    try:
        got = tuple(batch_sizes(micro, glob, None, dp, FLAGS))
    except ValueError as err:
        assert want is None
        assert str(err).startswith(f"--global-batch-size {glob} is not divisible")
        return
    assert got == want


def test_the_rule_words_its_errors_in_each_doors_names():
    """Each refusal is one line in the door's own names, the numbers written out; the sizes
    returned are ints."""
    from libai.config.resolve import LIBAI_BATCH_NAMES

    cases = [
        ((None, None, 2, 1), LIBAI_BATCH_NAMES,
         "set train.train_micro_batch_size or train.global_batch_size (or both)"),
        ((4, 10, None, 2), LIBAI_BATCH_NAMES,
         "train.global_batch_size=10 is not divisible by train.train_micro_batch_size 4 x 2 "
         "data-parallel ranks = 8, so train.num_accumulation_steps cannot be derived"),
        ((4, 12, 2, 2), LIBAI_BATCH_NAMES,
         "train.global_batch_size=12 is not divisible by train.train_micro_batch_size 4 x 2 "
         "data-parallel ranks = 8"),
        ((4, 16, 1, 2), LIBAI_BATCH_NAMES,
         "train.num_accumulation_steps=1 contradicts the batch sizes: train.global_batch_size "
         "16 / (train.train_micro_batch_size 4 x 2 data-parallel ranks) = 2 micro-batches per "
         "step; leave train.num_accumulation_steps unset (it is derived) or change "
         "train.train_micro_batch_size"),
        ((None, 10, 2, 2), LIBAI_BATCH_NAMES,
         "train.global_batch_size=10 is not divisible by 2 data-parallel ranks x "
         "train.num_accumulation_steps 2 = 4, so train.train_micro_batch_size cannot be derived"),
        ((4, 20, None, 2), FLAGS,
         "--global-batch-size 20 is not divisible by --micro-batch-size 4 x 2 data-parallel "
         "ranks = 8"),
        ((None, 9, None, 2), FLAGS,
         "--global-batch-size 9 is not divisible by 2 data-parallel ranks = 2, so "
         "--micro-batch-size cannot be derived"),
    ]  # fmt: skip
    for args, names, message in cases:
        with pytest.raises(ValueError) as err:
            batch_sizes(*args, names)
        assert str(err.value) == message
    for args in ((None, 12, 2, 3), (2, 12, None, 3), (2, None, 2, 3)):
        assert all(type(n) is int for n in batch_sizes(*args))
    for dp in (0, True):
        with pytest.raises(ValueError, match="data parallel size must be a positive integer"):
            resolve_batch_sizes(OmegaConf.create({"train_micro_batch_size": 2}), dp)
