"""``@configurable``'s cfg mapping and ``libai_cfg``, and the exact error texts of
``instantiate`` (the config path, the target's name, the original message), each written out
by hand."""

from __future__ import annotations

import functools
import logging

import pytest
from omegaconf import OmegaConf

from libai.config import LazyCall, instantiate
from libai.config.configurable import configurable
from libai.config.instantiate import InstantiationError


class Toy:
    @configurable
    def __init__(self, a, b=2, *rest, hidden=3, hidden2=4, hidden3=5, hidden4=6):
        self.got = (a, b, rest, hidden, hidden2, hidden3, hidden4)


class Open:
    @configurable
    def __init__(self, a=1, **extra):
        self.got = (a, extra)


class Quiet:
    libai_no_effect_keys = {"bias_dropout_fusion": "fused in the kernel anyway"}

    @configurable
    def __init__(self, a=1):
        self.a = a


# ----------------------------------------------------------------------------- @configurable


def test_cfg_equals_keywords_and_keywords_win():
    toy = Toy(cfg={"a": 10, "hidden2": 40, "hidden4": 60}, hidden4=61)
    assert toy.got == (10, 2, (), 3, 40, 5, 61)
    assert Toy(a=10, hidden2=40, hidden4=61).got == toy.got


def test_libai_cfg_holds_every_named_argument_with_defaults():
    toy = Toy(1, 5, 6, 7, hidden=8)
    # *rest is not a hyper-parameter; self is not one either
    assert toy.libai_cfg == {"a": 1, "b": 5, "hidden": 8, "hidden2": 4, "hidden3": 5, "hidden4": 6}
    # **extra is flattened into the keys it holds
    assert Open(cfg={"a": 2, "zz": 3}).libai_cfg == {"a": 2, "zz": 3}
    assert Open(cfg={"a": 2, "zz": 3}).got == (2, {"zz": 3})  # **extra takes any key


def test_an_unknown_key_names_the_three_closest():
    with pytest.raises(ValueError) as info:
        Toy(cfg={"a": 1, "hiden": 2})
    # 'hidden' 0.91, then hidden2..4 tie at 0.83 and difflib lists ties in reverse order
    assert str(info.value) == (
        "Toy got an unknown config key model.cfg.hiden. Did you mean hidden, hidden4, hidden3?"
    )
    with pytest.raises(ValueError) as info:
        Toy(cfg={"a": 1, "qqqq": 2})
    assert str(info.value) == "Toy got an unknown config key model.cfg.qqqq."


class TakesCfg:
    @configurable
    def __init__(self, a=1, cfg=None):  # its own "cfg" is hidden by the wrapper's
        self.got = (a, cfg)


@pytest.mark.parametrize("owner", [Toy, TakesCfg])
@pytest.mark.parametrize("key", ["self", "cfg"])
def test_self_and_cfg_are_not_config_keys(owner, key):
    name = owner.__name__
    with pytest.raises(ValueError, match=f"^{name} got an unknown config key model.cfg.{key}."):
        owner(cfg={"a": 1, key: 2})


def test_no_effect_keys_are_dropped_with_a_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="libai.config.configurable"):
        quiet = Quiet(cfg={"a": 3, "bias_dropout_fusion": True})
    assert quiet.a == 3
    assert (
        "Quiet: keys with no effect here: model.cfg.bias_dropout_fusion "
        "(fused in the kernel anyway)" in caplog.text
    )
    with pytest.raises(ValueError, match="^Quiet got an unknown config key model.cfg.b"):
        Quiet(cfg={"b": 1})


def test_a_config_passed_down_positionally_leaves_the_wrappers_keys(caplog):
    """LiBai's project models hand their whole config to the encoder they wrap
    (``BertModel(cfg)``): the keys the wrapper added are named once and left; the same key
    given as ``cfg=`` (a config's own model node) is still an error."""
    with caplog.at_level(logging.INFO, logger="libai.config.configurable"):
        toy = Toy(OmegaConf.create({"a": 7, "hidden": 9, "num_classes": 2}))
    assert toy.got == (7, 2, (), 9, 4, 5, 6)
    assert "model.cfg.num_classes (not one of Toy's arguments)" in caplog.text
    assert Toy({"a": 1}).libai_cfg["a"] == 1
    with pytest.raises(ValueError, match="unknown config key model.cfg.num_classes"):
        Toy(cfg={"a": 7, "num_classes": 2})
    assert Toy(5).got[0] == 5  # a positional value that is no mapping is the argument


# ----------------------------------------------------------------------------- instantiate


def raise_key_error():
    raise KeyError("some_key")


def raise_value_error_with_two_args():
    raise ValueError("first", 2)


class TwoArgError(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)


def raise_two_arg_error():
    raise TwoArgError("x", "y")


def make_factory(scale):
    def factory():
        raise ValueError(f"scale {scale}")

    return factory


def _error(cfg):
    with pytest.raises(Exception) as info:
        instantiate(cfg)
    return info.value


def test_a_key_error_keeps_its_text_unquoted():
    err = _error(OmegaConf.create({"data": LazyCall(raise_key_error)()}).data)
    assert type(err) is KeyError
    name = f"{__name__}.raise_key_error"
    assert err.args == (f"while instantiating 'data' (_target_={name}): some_key",)


def test_another_error_shows_as_str():
    err = _error({"_target_": raise_value_error_with_two_args})  # a plain dict: the root
    assert type(err) is ValueError
    name = f"{__name__}.raise_value_error_with_two_args"
    assert str(err) == f"while instantiating '<root>' (_target_={name}): ('first', 2)"


def test_an_error_type_that_cannot_take_the_message_becomes_instantiation_error():
    err = _error({"_target_": raise_two_arg_error})
    assert type(err) is InstantiationError
    name = f"{__name__}.raise_two_arg_error"
    assert str(err) == (f"while instantiating '<root>' (_target_={name}): ('x', 'y') (TwoArgError)")
    assert isinstance(err.__cause__, TwoArgError)


def test_the_target_is_described_by_its_import_path_qualname_or_repr():
    def local_boom():
        raise ValueError("boom")

    err = _error({"_target_": local_boom})  # no import path: its qualname
    assert str(err) == (
        "while instantiating '<root>' (_target_=test_the_target_is_described_by_its_import_path"
        "_qualname_or_repr.<locals>.local_boom): boom"
    )
    # neither an import path nor a qualname: its repr
    boom = functools.partial(raise_value_error_with_two_args)
    err = _error({"_target_": boom})
    assert str(err) == f"while instantiating '<root>' (_target_={boom!r}): ('first', 2)"
    # a lazy target: what it is built from
    err = _error({"_target_": {"_target_": make_factory, "scale": 3}})
    assert str(err) == (
        f"while instantiating '<root>' (_target_=<built from {__name__}.make_factory>): scale 3"
    )


def boom():
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    "cfg, path",
    [
        ({"a": {"_target_": boom}}, "a"),  # a plain dict root
        ({"a": {"b": {"_target_": boom}}}, "a.b"),
        ({"a": [1, {"_target_": boom}]}, "a[1]"),
        (OmegaConf.create({"_target_": boom}, flags={"allow_objects": True}), "<root>"),
        # the innermost failing node is named, once
        ({"a": {"_target_": make_factory, "scale": {"_target_": boom}}}, "a.scale"),
        ({"a": {"_target_": {"_target_": boom}}}, "a._target_"),  # a lazy target
    ],
)
def test_the_error_names_the_path_from_the_root(cfg, path):
    err = _error(cfg)
    assert type(err) is RuntimeError
    assert err.args == (f"while instantiating '{path}' (_target_={__name__}.boom): boom",)


def test_tuples_stay_tuples_and_their_items_are_built():
    built = instantiate({"t": (1, {"_target_": dict, "x": 2}), "l": [{"_target_": dict}]})
    assert built == {"t": (1, {"x": 2}), "l": [{}]} and type(built["t"]) is tuple
    assert instantiate((3, {"_target_": dict, "y": 4})) == (3, {"y": 4})
