"""Command-line overrides are type-checked against the value they replace, in both config
doors (LiBai's ``LazyConfig.apply_overrides`` and FleetX's YAML ``-o``), before anything is
written: ``train.train_iter=abc`` is one line, ``train.train_iter expects an int, got 'abc'``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf
from train_net_helpers import ROOT, TRAIN_NET

from libai.config import LazyConfig
from libai.config.overrides import (
    ConfigKeyError,
    OverrideError,
    OverrideTypeError,
    check_override_type,
)
from libai.dist.cli import INPUT_ERRORS
from libai.fleetx.yaml_config import load_yaml_config

GPT2_CONFIG = ROOT / "configs" / "gpt2_pretrain.py"
GPT_YAML = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
TRAIN_YAML = ROOT / "tools" / "train.py"

#: the same keys in both doors: ``train.<key>`` (LiBai) and ``Model.<key>`` (FleetX, an open
#: section); ``call`` is a LazyCall node in the Python config, a ``_target_`` mapping in YAML
PY_CONFIG = """
from libai.config import LazyCall

train = dict(
    iters=10,
    zero=0,
    lr=0.5,
    amp=True,
    out="runs",
    ids=[1, 2],
    pair=(1, 2),
    unset=None,
    alias="${.iters}",
    text="run_${.iters}",
    broken="${.nope}",
    node=dict(a=1),
    call=LazyCall(dict)(a=1),
)
"""
YAML_CONFIG = """
Model:
  module: GPTModule
  iters: 10
  zero: 0
  lr: 0.5
  amp: true
  out: runs
  ids: [1, 2]
  unset: null
  alias: ${.iters}
  text: run_${.iters}
  broken: ${.nope}
  node: {a: 1}
  call: {_target_: builtins.dict, a: 1}
"""
DOORS = ("lazy", "yaml")


@pytest.fixture(params=DOORS)
def door(request, tmp_path):
    """``apply(overrides) -> section``: the overrides applied in one door (the keys without
    their section prefix: ``iters=3`` is ``train.iters=3`` or ``Model.iters=3``)."""
    if request.param == "lazy":
        path = tmp_path / "cfg.py"
        path.write_text(PY_CONFIG)

        def apply(*overrides):
            cfg = LazyConfig.load(str(path))
            return LazyConfig.apply_overrides(cfg, [_prefixed("train", o) for o in overrides]).train

        apply.section = "train"
    else:
        path = tmp_path / "cfg.yaml"
        path.write_text(YAML_CONFIG)

        def apply(*overrides):
            return load_yaml_config(path, [_prefixed("Model", o) for o in overrides]).Model

        apply.section = "Model"
    return apply


def _prefixed(section: str, override: str) -> str:
    """``override`` with its key under ``section``, keeping a ``+`` / ``++`` / ``~`` prefix."""
    body = override.lstrip("+~")
    return f"{override[: len(override) - len(body)]}{section}.{body}"


def _plain(value):
    """A config value as plain Python (lists and dicts unwrapped)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


# (key, text typed, value stored): the value keeps its type (checked with ``type(..) is``)
ACCEPTED = [
    ("iters", "20", 20),
    ("iters", "1e3", 1000),  # an integral float becomes an int
    ("iters", "1_000", 1000),
    ("zero", "0.25", 0.25),  # an int 0 takes a float (Python configs write 0 for 0.0)
    ("zero", "3", 3),
    ("lr", "1", 1.0),  # an int for a float is stored as a float
    ("lr", "3e-4", 3e-4),
    ("amp", "false", False),
    ("amp", "True", True),
    ("out", "2024", 2024),  # a str key takes Hydra's value, as LiBai stores it
    ("out", "1e3", 1000.0),
    ("out", "true", True),
    ("out", "'2024'", "2024"),  # quoted: the string
    ("out", "'runs/my run'", "runs/my run"),  # Hydra's quoting
    ("out", "'a,b'", "a,b"),
    ("out", "other", "other"),
    ("ids", "[3]", [3]),
    ("ids", "[]", []),
    ("ids.0", "5", 5),
    ("iters", "null", None),  # null fits every key
    ("amp", "null", None),
    ("ids", "null", None),
    ("unset", "abc", "abc"),  # a None key takes anything
    ("unset", "3", 3),
    ("alias", "7", 7),  # an interpolation is checked as the int it resolves to
    ("text", "5", 5),  # ... or as the str (which takes any value)
    ("iters", "'10'", "10"),  # quoted: the user asked for a string (LiBai stores it)
    ("broken", "abc", "abc"),  # unresolvable: not checked
    ("lr", "${.iters}", 10),  # a new interpolation is not checked (it resolves later)
    ("node", "abc", "abc"),  # mappings are not checked
    ("call", "abc", "abc"),  # nor LazyCall nodes
]


@pytest.mark.parametrize("key, text, stored", ACCEPTED)
def test_accepted_values_are_stored_typed(door, key, text, stored):
    section = door(f"{key}={text}")
    got = _plain(OmegaConf.select(section, key))
    assert got == stored and type(got) is type(stored)


# (key, text typed, what the message says is expected)
REJECTED = [
    ("iters", "abc", "an int"),
    ("iters", "2.5", "an int"),
    ("iters", "true", "an int"),  # a bool is not an int
    ("iters", "[1]", "an int"),
    ("zero", "abc", "a number"),
    ("zero", "false", "a number"),
    ("lr", "abc", "a float"),
    ("lr", "true", "a float"),
    ("amp", "1", "a bool"),
    ("amp", "yes", "a bool"),
    ("ids", "3", "a list"),
    ("ids", "abc", "a list"),
    ("ids", "{a:1}", "a list"),
    ("ids.0", "abc", "an int"),
    ("alias", "abc", "an int"),  # the type the interpolation resolves to
    ("node.a", "abc", "an int"),  # a mapping's own values are checked
    ("call.a", "abc", "an int"),
]


@pytest.mark.parametrize("key, text, expected", REJECTED)
def test_rejected_values_name_key_type_and_text(door, key, text, expected):
    with pytest.raises(OverrideTypeError) as info:
        door(f"{key}={text}")
    assert str(info.value) == f"{door.section}.{key} expects {expected}, got {text!r}"


def test_force_add_to_an_existing_key_is_checked_and_add_is_not(door):
    with pytest.raises(OverrideTypeError, match=r"iters expects an int, got 'abc'"):
        door("++iters=abc")
    assert door("+new_key=abc").new_key == "abc"
    assert door("++other_key=abc").other_key == "abc"


def test_key_checks_sweeps_and_deletes_keep_working(door, request):
    if request.node.callspec.params["door"] == "lazy":
        with pytest.raises(ConfigKeyError, match="iters"):
            door("itres=3")
    else:  # FleetX's -o adds a new field (Model is an open section: kept)
        assert door("itres=3").itres == 3
    with pytest.raises(ConfigKeyError, match="already exists"):
        door("+iters=abc")
    with pytest.raises(OverrideError, match="sweep"):
        door("iters=1,2")
    assert "iters" not in door("~iters")


def test_a_tuple_takes_a_list(tmp_path):
    (tmp_path / "cfg.py").write_text(PY_CONFIG)
    cfg = LazyConfig.load(str(tmp_path / "cfg.py"))
    with pytest.raises(OverrideTypeError, match=r"^train.pair expects a list, got '3'$"):
        LazyConfig.apply_overrides(cfg, ["train.pair=3"])
    assert list(LazyConfig.apply_overrides(cfg, ["train.pair=[3,4]"]).train.pair) == [3, 4]


def test_check_override_type_is_the_shared_rule():
    assert check_override_type("k", int, 1000.0, "1e3") == 1000
    assert check_override_type("k", None, "abc", "abc") == "abc"
    assert check_override_type("k", str, 2.5, "2.50") == 2.5  # Hydra's value, as LiBai's
    assert check_override_type("k", int, "2.50", "'2.50'") == "2.50"  # quoted: a string
    with pytest.raises(OverrideTypeError, match=r"^a\.b expects an int, got 'abc'$"):
        check_override_type("a.b", int, "abc", "abc")
    # the CLI reports it in one line (run_cli's input errors)
    assert issubclass(OverrideTypeError, INPUT_ERRORS)


def test_the_real_configs_of_both_doors():
    cfg = LazyConfig.load(str(GPT2_CONFIG))
    with pytest.raises(OverrideTypeError) as info:
        LazyConfig.apply_overrides(cfg, ["train.train_iter=abc"])
    assert str(info.value) == "train.train_iter expects an int, got 'abc'"
    LazyConfig.apply_overrides(cfg, ["train.warmup_ratio=0.01", "train.output_dir='2024'"])
    assert cfg.train.warmup_ratio == 0.01 and cfg.train.output_dir == "2024"
    with pytest.raises(OverrideTypeError) as info:
        load_yaml_config(GPT_YAML, ["Engine.max_steps=abc"])
    assert str(info.value) == "Engine.max_steps expects an int, got 'abc'"
    yaml_cfg = load_yaml_config(GPT_YAML, ["Engine.max_steps=1e3", "Optimizer.lr.max_lr=1"])
    assert yaml_cfg.Engine.max_steps == 1000 and type(yaml_cfg.Optimizer.lr.max_lr) is float


# ---- end to end: one line on stderr, exit 1, nothing written --------------------------------
def _run(cmd, env):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def _assert_one_line_error(proc, message, out_dir):
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stderr.strip().splitlines() == [f"error: OverrideTypeError: {message}"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not out_dir.exists()


def test_train_net_bad_override_is_one_line_before_any_output(sample_env, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(TRAIN_NET), "--config-file", str(GPT2_CONFIG)]
    proc = _run([*cmd, f"train.output_dir={out}", "train.train_iter=abc"], sample_env)
    _assert_one_line_error(proc, "train.train_iter expects an int, got 'abc'", out)


def test_fleetx_train_bad_override_is_one_line_before_any_output(sample_env, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(TRAIN_YAML), "-c", str(GPT_YAML)]
    # Global.device=cpu: without the check this run gets as far as writing its output here too
    overrides = ["-o", "Global.device=cpu", "-o", f"Engine.save_load.output_dir={out}"]
    overrides += ["-o", "Engine.max_steps=abc"]
    proc = _run([*cmd, *overrides], sample_env)
    _assert_one_line_error(proc, "Engine.max_steps expects an int, got 'abc'", out)
