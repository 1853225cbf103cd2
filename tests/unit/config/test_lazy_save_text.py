"""``LazyConfig.save``'s YAML text and warning, ``.pkl`` loading, ``to_dict`` and
``from configs.x import y`` in config files, each against a hand-written expectation."""

from __future__ import annotations

import enum
import logging
import os
import subprocess
import sys
import textwrap
import types
from collections import namedtuple

import cloudpickle
import pytest
import torch
from locales import ascii_locale
from omegaconf import DictConfig, ListConfig, OmegaConf

from libai.config import LazyConfig

Pair = namedtuple("Pair", ["left", "right"])


class Color(enum.Enum):
    RED = 1


def make(**kwargs):
    return kwargs


def _objects(content):
    return OmegaConf.create(content, flags={"allow_objects": True})


def _save(cfg, path, caplog):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="libai.config.lazy"):
        LazyConfig.save(cfg, path)
    return path.read_text(encoding="utf-8")


def test_the_yaml_text_keeps_order_unicode_inline_lists_and_long_lines(tmp_path, caplog):
    long = " ".join(["word"] * 60)  # 299 characters: one line, not folded at 80
    cfg = _objects({"zeta": {"ids": [3, 1], "name": "café", "long": long}, "alpha": 1})
    text = _save(cfg, tmp_path / "c.yaml", caplog)
    assert text == f"zeta:\n  ids: [3, 1]\n  name: café\n  long: {long}\nalpha: 1\n"
    assert not caplog.text and not (tmp_path / "c.yaml.pkl").exists()
    loaded = LazyConfig.load(tmp_path / "c.yaml")
    assert list(loaded) == ["zeta", "alpha"] and list(loaded.zeta) == ["ids", "name", "long"]
    assert loaded == cfg


def test_an_enum_is_saved_as_its_name(tmp_path, caplog):
    text = _save(_objects({"a": {"color": Color.RED}}), tmp_path / "c.yaml", caplog)
    assert text == "a: {color: RED}\n"  # a mapping of scalars: inline
    assert not caplog.text and not (tmp_path / "c.yaml.pkl").exists()


def test_an_object_target_and_the_keys_after_it(tmp_path, caplog):
    cfg = _objects({"m": {"_target_": make, "x": 1, "y": [2]}})
    text = _save(cfg, tmp_path / "c.yaml", caplog)
    assert text == f"m:\n  _target_: {__name__}.make\n  x: 1\n  y: [2]\n"


def test_the_warning_names_each_unsaveable_value_by_its_path(tmp_path, caplog):
    fn = torch.nn.functional.relu  # importable, but not a _target_: a value YAML cannot hold
    cfg = _objects(
        {
            "top": object(),
            "a": {"fn": fn, "l": [1, fn], "pair": Pair(left=1, right=torch.zeros(1))},
        }
    )
    path = tmp_path / "c.yaml"
    _save(cfg, path, caplog)
    assert f"in {path}: top, a.fn, a.l[1], a.pair.right. The whole config is in {path}.pkl" in (
        caplog.text
    )
    text = path.read_text(encoding="utf-8")
    assert f"  l: [1, {fn!r}]\n" in text
    assert f"  pair: {{_target_: {__name__}.Pair, left: 1, right: 'tensor([0.])'}}\n" in text
    loaded = LazyConfig.load(f"{path}.pkl")
    assert (
        loaded.a.fn is fn
        and loaded.a.l[1] is fn
        and torch.equal(loaded.a.pair.right, torch.zeros(1))
    )


def test_a_list_config_root_names_its_items(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    text = _save(ListConfig([1, object()], flags={"allow_objects": True}), path, caplog)
    assert text.startswith("[1, <object object at")
    assert f"in {path}: [1]. The whole config" in caplog.text


def test_a_pickle_of_plain_containers_loads_as_a_config(tmp_path):
    path = tmp_path / "plain.pkl"
    path.write_bytes(cloudpickle.dumps({"a": {"b": 2}, "l": [1]}))
    cfg = LazyConfig.load(path)
    assert isinstance(cfg, DictConfig) and cfg.a.b == 2 and isinstance(cfg.l, ListConfig)
    assert LazyConfig.load(path, keys="a") == {"b": 2}


def test_to_dict_resolves_interpolations():
    cfg = OmegaConf.create({"a": 3, "b": {"c": "${a}", "d": "run_${a}"}})
    out = LazyConfig.to_dict(cfg)
    assert out == {"a": 3, "b": {"c": 3, "d": "run_3"}} and type(out) is dict
    assert LazyConfig.to_dict(types.MappingProxyType({"x": 1})) == {"x": 1}
    assert LazyConfig.to_dict(5) == 5


def test_from_configs_imports_a_config_file_on_sys_path(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "configs" / "zz_cfg_test").mkdir(parents=True)
    (tree / "configs" / "zz_cfg_test" / "base.py").write_text("train = dict(iters=1)\n")
    (tree / "configs" / "zz_cfg_test" / "optim.py").write_text(
        "from .base import train\ntrain.iters = 5\noptim = dict(lr=0.5, iters=train.iters)\n"
    )
    project = tmp_path / "project.py"
    project.write_text(
        textwrap.dedent(
            """
            from configs.zz_cfg_test.optim import optim, train
            optim.lr = 0.25
            """
        )
    )
    monkeypatch.syspath_prepend(str(tree))
    monkeypatch.chdir(tmp_path)  # not the tree: the sys.path entry is what finds it
    before = set(sys.modules)
    try:
        cfg = LazyConfig.load(project)
    finally:  # a broken lookup would fall back to Python's import: leave no module behind
        for name in set(sys.modules) - before:
            if name == "configs" or name.startswith("configs."):
                del sys.modules[name]
    assert cfg == {"optim": {"lr": 0.25, "iters": 5}, "train": {"iters": 5}}


SAVE_UNDER_ASCII_LOCALE = """
import sys
from omegaconf import OmegaConf
from libai.config import LazyConfig
LazyConfig.save(OmegaConf.create({"name": "caf\\u00e9"}), sys.argv[1])
"""


def test_save_writes_utf8_under_an_ascii_locale(tmp_path):
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    script = tmp_path / "save.py"
    script.write_text(SAVE_UNDER_ASCII_LOCALE)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "c.yaml").read_bytes() == "{name: café}\n".encode()


def test_save_writes_utf8_under_an_ascii_locale_in_process(tmp_path):
    # the same in this process (the test above starts a fresh interpreter)
    with ascii_locale():
        LazyConfig.save(OmegaConf.create({"name": "caf\u00e9"}), str(tmp_path / "c.yaml"))
    assert (tmp_path / "c.yaml").read_bytes() == "{name: caf\u00e9}\n".encode()


def test_only_values_past_column_9999_are_folded(tmp_path, caplog):
    # YAML folds a plain scalar at the first space past its width (9999): "k: " + 9992
    # characters + " b c" reaches column 9999 at the space before "d", so that line folds
    # and one character less does not; both load back equal
    for n, lines in ((9991, 1), (9992, 2)):
        value = "a" * n + " b c d"
        text = _save(_objects({"k": value}), tmp_path / f"{n}.yaml", caplog)
        assert text.count("\n") == lines
        assert LazyConfig.load(tmp_path / f"{n}.yaml").k == value


def test_a_yaml_or_pickle_list_loads_as_a_list_config_that_holds_objects(tmp_path):
    (tmp_path / "l.yaml").write_text("- 1\n- {a: 2}\n")
    (tmp_path / "l.pkl").write_bytes(cloudpickle.dumps([1, {"a": 2}]))
    for name in ("l.yaml", "l.pkl"):
        cfg = LazyConfig.load(tmp_path / name)
        assert isinstance(cfg, ListConfig) and cfg == [1, {"a": 2}]
        marker = object()
        cfg.append(marker)  # like every loaded config, it may hold objects
        assert cfg[2] is marker


def test_a_target_without_a_module_is_written_as_its_repr(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    text = _save(_objects({"a": {"_target_": enum, "x": 1}}), path, caplog)
    assert text == f"a: {{_target_: {enum!r}, x: 1}}\n"
    assert f"in {path}: a._target_. The whole config" in caplog.text


def test_a_yml_file_loads_and_a_missing_name_names_the_file(tmp_path):
    (tmp_path / "c.yml").write_text("a: {b: 2}\n")
    assert LazyConfig.load(tmp_path / "c.yml") == {"a": {"b": 2}}
    assert LazyConfig.load(tmp_path / "c.yml", keys=["a"]) == ({"b": 2},)
    path = tmp_path / "c.py"
    path.write_text("a = dict(b=2)\n")
    with pytest.raises(KeyError) as info:
        LazyConfig.load(path, keys=["a", "nope"])
    assert info.value.args == (f"config file {path} defines no 'nope'",)
