"""The exact words of an override's key errors: which existing keys a typo suggests (siblings
with a similar name first, else any close path but the typo's own ancestors), how many, how
they are joined, and the '+' line that would add the key on purpose.

The expected lists are worked out by hand with difflib's ratio ``2 * matches / total length``
and its cutoff 0.6 (e.g. ``'hiden'`` vs ``'hidden'``: 2 * 5 / 11 = 0.91)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from libai.config import LazyConfig
from libai.config.overrides import ConfigKeyError, OverrideTypeError, _closest_keys


def _cfg():
    return OmegaConf.create(
        {
            "model": {"cfg": {"lr1": 1, "lr2": 2, "lr3": 3, "lr4": 4, "hidden": 5}, "name": "x"},
            "train": {"dist": {"tp": 1, "pp": 2}, "seed": 3},
            "seed": 7,
            "x": {"seedz": 1},
            "Xscale": 2.5,
        }
    )


def _message(override: str) -> str:
    cfg = _cfg()
    with pytest.raises(ConfigKeyError) as info:
        LazyConfig.apply_overrides(cfg, [override])
    assert cfg == _cfg()  # nothing was written
    return str(info.value)


@pytest.mark.parametrize(
    "key, expected",
    [
        # a sibling three levels down: only its own leaf is compared ('hiden' ~ 'hidden'),
        # so paths of other branches are not offered
        ("model.cfg.hiden", ["model.cfg.hidden"]),
        # more than three close siblings: the three closest, ties in reverse order (difflib)
        ("model.cfg.lr", ["model.cfg.lr4", "model.cfg.lr3", "model.cfg.lr2"]),
        # a top-level typo: its siblings are the top-level keys ('seed' 0.89; not 'x.seedz')
        ("seedx", ["seed"]),
        # no close sibling: close full paths, but never the typo's ancestors ('model' 0.77)
        ("model.qq", ["model.cfg", "model.name"]),
        # ... at depth three ('model.cfg' 0.78, 'model' are ancestors)
        ("model.cfg.qqqq", ["model.cfg.lr4", "model.cfg.lr3", "model.cfg.lr2"]),
        ("train.dist.tq", ["train.dist.tp", "train.dist.pp", "train.seed"]),
    ],
)
def test_a_typo_suggests_the_closest_keys(key, expected):
    assert _closest_keys(_cfg(), key) == expected
    hint = " or ".join(expected)
    assert _message(f"{key}=1") == (
        f"Override '{key}=1': the config has no key '{key}'. Did you mean {hint}? "
        f"To add a new key, write '+{key}=1'."
    )


def test_the_number_of_suggestions_is_n():
    cfg = _cfg()
    assert _closest_keys(cfg, "model.cfg.lr", n=1) == ["model.cfg.lr4"]  # siblings
    assert _closest_keys(cfg, "model.qq", n=1) == ["model.cfg"]  # any path
    assert _closest_keys(cfg, "model.cfg.lr", n=4) == [
        "model.cfg.lr4",
        "model.cfg.lr3",
        "model.cfg.lr2",
        "model.cfg.lr1",
    ]


def test_a_delete_of_a_missing_key_says_how_to_add_it():
    # '~' is dropped from the '+' line, and only the leading '+' / '~' (not the key's 'X')
    assert _message("~Xscal") == (
        "Override '~Xscal': the config has no key 'Xscal'. Did you mean Xscale? "
        "To add a new key, write '+Xscal'."
    )
    # nothing close: no "Did you mean"
    assert _message("~qqqqqqqq") == (
        "Override '~qqqqqqqq': the config has no key 'qqqqqqqq'. "
        "To add a new key, write '+qqqqqqqq'."
    )


def test_adding_an_existing_key_shows_its_value():
    assert _message("+model.name=3") == (
        "Override '+model.name=3': key 'model.name' already exists (value 'x'); "
        "drop the '+' to change it, or write '++model.name=3'."
    )
    assert _message("+train.dist=1") == (
        "Override '+train.dist=1': key 'train.dist' already exists (value {'tp': 1, 'pp': 2}); "
        "drop the '+' to change it, or write '++train.dist=1'."
    )


def test_config_key_error_str_is_its_message_unquoted():
    assert str(ConfigKeyError("no key 'a'")) == "no key 'a'"  # KeyError would quote it
    assert str(ConfigKeyError()) == ""


def test_values_with_no_type_to_check_take_any_override():
    import torch
    from omegaconf import ListConfig

    cfg = OmegaConf.create(
        {"a": {"m": "???", "l": ListConfig(None), "d": torch.float32, "n": None}},
        flags={"allow_objects": True},
    )
    LazyConfig.apply_overrides(cfg, ["a.m=5", "a.l=5", "a.d=float16", "a.n=[1]"])
    assert cfg.a.m == 5 and type(cfg.a.m) is int  # "???" is unset, not a str
    assert cfg.a.l == 5  # a list that is None
    assert cfg.a.d == "float16"  # an object: no check
    assert list(cfg.a.n) == [1]


def test_a_path_through_an_interpolation_fails_naming_it():
    # "a: ${d}" is an alias: "a.x=2" used to replace a with {x: 2} (dropping y and the
    # link to d), and "~a.x" deleted d.x; neither lands where the override says
    for override in ("a.x=2", "~a.x", "++a.x=2", "a.x.z=1", "l.0.x=2"):
        cfg = OmegaConf.create({"d": {"x": 1, "y": 3}, "a": "${d}", "l": ["${d}"]})
        with pytest.raises(ConfigKeyError) as info:
            LazyConfig.apply_overrides(cfg, [override])
        where = "l.0" if override.startswith("l.") else "a"
        assert str(info.value).startswith(
            f"cannot set '{override.lstrip('+~').partition('=')[0]}': '{where}' is an "
            "interpolation (${d})"
        )
        assert OmegaConf.to_container(cfg) == {"d": {"x": 1, "y": 3}, "a": "${d}", "l": ["${d}"]}


def test_a_path_through_a_value_names_its_type():
    cfg = OmegaConf.create({"s": 3, "l": [1, {"x": 2}]})
    with pytest.raises(ConfigKeyError) as info:
        LazyConfig.apply_overrides(cfg, ["s.x=2"])
    assert str(info.value) == "cannot set 's.x': 's' is a int (3), not a config node"
    with pytest.raises(ConfigKeyError) as info:
        LazyConfig.apply_overrides(cfg, ["l.0.x=2"])
    assert str(info.value) == "cannot set 'l.0.x': 'l.0' is a int (1), not a config node"
    LazyConfig.apply_overrides(cfg, ["l.1.x=5"])
    assert cfg.l[1].x == 5
    for override in ("l.2=1", "l.5=1", "l.x=1", "l.7.x=1", "l.X1=1"):  # not an index
        with pytest.raises(ConfigKeyError, match=f"no key '{override.partition('=')[0]}'"):
            LazyConfig.apply_overrides(cfg, [override])


def test_deletes_remove_exactly_the_named_key():
    cfg = _cfg()
    cfg.model.cfg.seq = [1, 2, 3]
    LazyConfig.apply_overrides(cfg, ["~model.cfg.lr2", "~model.cfg.seq.1", "~train.seed"])
    assert list(cfg.model.cfg) == ["lr1", "lr3", "lr4", "hidden", "seq"]
    assert list(cfg.model.cfg.seq) == [1, 3] and list(cfg.train) == ["dist"]


def test_a_rejected_value_is_quoted_as_typed_and_a_quoted_one_is_a_string():
    cfg = _cfg()
    with pytest.raises(OverrideTypeError) as info:
        LazyConfig.apply_overrides(cfg, ["train.seed=a_b"])
    assert str(info.value) == "train.seed expects an int, got 'a_b'"
    LazyConfig.apply_overrides(cfg, ["train.seed='a=b'"])  # quoted: LiBai stores the string
    assert cfg.train.seed == "a=b"


def test_added_keys_land_in_a_struct_config_and_hold_objects():
    cfg = OmegaConf.create({"a": {"x": 1}})
    OmegaConf.set_struct(cfg, True)  # a struct config refuses new keys, except by override
    LazyConfig.apply_overrides(cfg, ["+a.new={k:1}", "++a.y=2", "a.x=5"])
    assert OmegaConf.to_container(cfg) == {"a": {"x": 5, "new": {"k": 1}, "y": 2}}

    cfg = OmegaConf.create({"a": {"x": 1}})  # not allow_objects itself
    LazyConfig.apply_overrides(cfg, ["+a.new={k:1}", "+a.l=[1]"])
    marker = object()
    cfg.a.new.obj = marker  # a script may put objects into what an override created
    cfg.a.l.append(marker)
    assert cfg.a.new.obj is marker and cfg.a.l[1] is marker
