"""``LazyConfig.to_py``: where lines wrap (at exactly 100 columns, nested groups indented by 4),
which modules it imports for callables, and the exact error naming a key it cannot write; each
expected text is written out by hand and the text is executed back to the same config."""

from __future__ import annotations

import collections
import enum
import textwrap

import pytest
import torch

from libai.config import LazyConfig
from libai.config.to_py import config_to_py


def _exec(source):
    namespace = {}
    exec(source, namespace)
    return namespace["cfg"]


HEADER = (
    'from omegaconf import OmegaConf\n\ncfg = OmegaConf.create(flags={"allow_objects": True})\n'
)


def test_a_line_of_exactly_100_columns_stays_on_one_line():
    fits = "x" * 82  # cfg.a = dict(s="...") is 16 + 82 + 2 = 100 columns
    source = config_to_py({"a": {"s": fits}})
    assert source == HEADER + f'cfg.a = dict(s="{fits}")\n'
    assert max(len(line) for line in source.splitlines()) == 100
    longer = fits + "x"
    assert config_to_py({"a": {"s": longer}}) == HEADER + f'cfg.a = dict(\n    s="{longer}",\n)\n'


def test_nested_groups_wrap_at_their_own_column_and_indent():
    # the inner dict starts at column 6 (4 spaces + "b=") and its line ends with a comma:
    # 93 characters fit exactly
    inner = {"c": "y" * 78, "d": 1}  # dict(c="...", d=1) is 7 + 78 + 8 = 93
    source = config_to_py({"a": {"b": inner}})
    assert source == HEADER + 'cfg.a = dict(\n    b=dict(c="' + "y" * 78 + '", d=1),\n)\n'
    assert max(len(line) for line in source.splitlines()) == 100
    assert _exec(source) == {"a": {"b": inner}}

    # one character more (it would end at column 101 with its comma) and longer: wrapped
    for wide in ({"c": "z" * 79, "d": 1}, {"c": "z" * 120, "d": [1, 2]}):
        source = config_to_py({"a": {"b": wide}})
        assert source == HEADER + textwrap.dedent(
            f"""\
            cfg.a = dict(
                b=dict(
                    c="{wide["c"]}",
                    d={wide["d"]},
                ),
            )
            """
        )
        assert _exec(source) == {"a": {"b": wide}}


def test_callables_import_their_longest_importable_module():
    cfg = {"a": {"load": LazyConfig.load, "opt": torch.optim.AdamW}}
    source = config_to_py(cfg)
    assert source == (
        "from omegaconf import OmegaConf\n"
        "import libai.config\n"
        "import torch.optim\n\n"
        'cfg = OmegaConf.create(flags={"allow_objects": True})\n'
        "cfg.a = dict(load=libai.config.LazyConfig.load, opt=torch.optim.AdamW)\n"
    )
    built = _exec(source)
    assert built.a.load is LazyConfig.load and built.a.opt is torch.optim.AdamW


def _error(cfg) -> str:
    with pytest.raises(ValueError) as info:
        config_to_py(cfg)
    return str(info.value)


def _cannot(path, value, why):
    return (
        f"LazyConfig.to_py cannot write '{path}' ({type(value).__name__}: {value!r:.60}) as "
        f"Python source: {why}. LazyConfig.save keeps such configs in a .pkl beside the YAML."
    )


def test_the_error_names_the_key_the_type_and_the_value():
    def act(x):
        return x

    tensor = torch.ones(2)
    assert _error({"m": {"act": act}}) == _cannot(
        "m.act", act, "its type or value has no import path"
    )
    assert _error({"m": {"w": tensor}}) == _cannot("m.w", tensor, "it has no source form")
    # an object _target_ without an import path
    assert _error({"m": {"_target_": act, "x": 1}}) == _cannot(
        "m._target_", act, "the target has no import path"
    )
    # a dict whose keys are not names is written as a literal: keys and values are named
    assert _error({"m": {1: tensor}}) == _cannot("m.1", tensor, "it has no source form")
    assert _error({"m": {act: 1}}) == _cannot("m", act, "its type or value has no import path")
    # a top-level key that is empty: the root
    assert _error({"": tensor}) == _cannot("<root>", tensor, "it has no source form")


# ----------------------------------------------------------------------------- values and names


class Color(enum.Enum):
    RED = 1


Pair = collections.namedtuple("Pair", ["left", "right"])


def make(**kwargs):
    return kwargs


def test_each_kind_of_value_as_its_source_text():
    cfg = {
        "m": {"f": 0.5, "inf": float("inf"), "s": "café", "e": {}},
        "k": {"c": Color.RED, "kw": {"class": 1}},
        "p": {"p": Pair(left=1, right=[2])},
        "n": {"_target_": make, "x": 1, "a-b": 2},
        "u": {"_target_": "pkg.café"},
    }
    source = config_to_py(cfg)
    name = __name__
    assert source == (
        "from omegaconf import OmegaConf\n"
        "from libai.config import LazyCall as L\n"
        f"import {name}\n\n"
        'cfg = OmegaConf.create(flags={"allow_objects": True})\n'
        'cfg.m = dict(f=0.5, inf=float("inf"), s="café", e={})\n'
        f'cfg.k = dict(c={name}.Color.RED, kw={{"class": 1}})\n'
        f"cfg.p = dict(p={name}.Pair(left=1, right=[2]))\n"
        f'cfg.n = L("{name}.make")(**{{"x": 1, "a-b": 2}})\n'
        'cfg.u = L("pkg.café")()\n'
    )
    built = _exec(source)
    assert built.k.c is Color.RED and built.p.p == Pair(left=1, right=[2])
    assert built.n == {"_target_": f"{name}.make", "x": 1, "a-b": 2}


def test_a_config_file_without_imports_has_no_header():
    assert config_to_py({"a": {"x": 1}}, prefix="") == "a = dict(x=1)\n"


@pytest.mark.parametrize("prefix", ["1x.", "class.", "cfg", "a.b."])
def test_the_prefix_must_be_a_name_and_a_dot(prefix):
    with pytest.raises(ValueError, match="to_py prefix must be"):
        config_to_py({"a": {"x": 1}}, prefix=prefix)


@pytest.mark.parametrize(
    "cfg",
    [
        {"L": {"x": 1}},
        {"OmegaConf": {"x": 1}},
        {"dict": {"x": 1}},
        {"float": {"x": 1}},
        {"torch": {"d": torch.float32}},
        {"libai": {"f": LazyConfig.load}},  # its import is libai.config
    ],
)
def test_a_config_file_key_that_clashes_with_an_import(cfg):
    with pytest.raises(ValueError, match=r"top-level keys \['\w+'\] clash"):
        config_to_py(cfg, prefix="")
    assert _exec(config_to_py(cfg)) == cfg  # with a prefix the names do not clash


def test_every_nested_place_names_its_path():
    tensor = torch.ones(1)
    LocalPair = collections.namedtuple("LocalPair", ["a"])

    class Local(enum.Enum):
        X = 1

    cases = {
        "m.a": {"m": {"_target_": "x.y", "a": tensor}},  # a lazy call's argument
        "m._target_.a": {"m": {"_target_": {"_target_": "x.y", "a": tensor}}},  # a lazy target
        "m.a-b": {"m": {"_target_": "x.y", "a-b": tensor}},  # a lazy call's ** literal
        "n.a-b": {"n": {"a-b": tensor}},  # a literal dict
        "m.p.left": {"m": {"p": Pair(left=tensor, right=1)}},  # a namedtuple's field
        "m.l[1]": {"m": {"l": [1, tensor]}},  # a list item
    }
    for path, cfg in cases.items():
        assert _error(cfg) == _cannot(path, tensor, "it has no source form"), path
    why = "its type or value has no import path"
    assert _error({"m": {"p": LocalPair(a=1)}}) == _cannot("m.p", LocalPair, why)
    assert _error({"m": {"c": Local.X}}) == _cannot("m.c", Local, why)
