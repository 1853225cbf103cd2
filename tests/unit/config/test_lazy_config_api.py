"""The rest of detectron2's / LiBai's config surface: ``LazyConfig.load_rel``, reloads that
earlier edits never reach, ``LazyConfig.to_py``, the pickle beside a YAML that cannot hold the
config, ``_recursive_``, lazy ``_target_`` nodes, and dataclass / namedtuple targets and values."""

from __future__ import annotations

import logging
import textwrap
from collections import namedtuple
from dataclasses import dataclass
from itertools import count

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from libai.config import LazyCall as L
from libai.config import LazyConfig, get_config, instantiate
from libai.config.instantiate import target_to_string


def named(cfg):
    """``cfg`` as plain containers with callable targets as their dotted paths (what
    :meth:`LazyConfig.save` writes and the runnable ``to_py`` prints)."""

    def walk(x):
        if isinstance(x, dict):
            return {
                k: target_to_string(v) if k == "_target_" and callable(v) else walk(v)
                for k, v in x.items()
            }
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(OmegaConf.to_container(cfg, resolve=False))


Point = namedtuple("Point", ["x", "y"])


@dataclass
class Shape:
    channels: int
    width: int | None = None
    height: int | None = None


class Holder:
    """Keeps whatever it is given (the target of the tests' nodes)."""

    def __init__(self, first=None, second=None, children=None):
        self.first, self.second, self.children = first, second, children


def make_adder(offset):
    """A factory: a node with this target builds a callable another node can call."""
    return lambda value: value + offset


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ----------------------------------------------------------------------------- load_rel / reload


def _config_tree(tmp_path):
    _write(tmp_path, "common/train.py", "train = dict(iters=10, nested=dict(lr=[1, 2]))\n")
    _write(
        tmp_path,
        "common/models/net.py",
        """
        from libai.config import LazyCall, LazyConfig
        train = LazyConfig.load_rel("../train.py", "train")  # relative to this file
        model = LazyCall(dict)(depth=train.iters, cfg=dict(width=4))
        """,
    )
    return _write(
        tmp_path,
        "exps/run.py",
        """
        from libai.config import LazyConfig
        from ..common.models.net import model
        train, = LazyConfig.load_rel("../common/train.py", ["train"])
        train.iters = 100
        model.cfg.width = 8
        """,
    )


def test_load_rel_resolves_against_the_calling_file_at_any_depth(tmp_path):
    cfg = LazyConfig.load(_config_tree(tmp_path))
    assert cfg.train.iters == 100 and cfg.model.depth == 10 and cfg.model.cfg.width == 8
    # from a plain module too (any file with __file__), and not from a string without one
    helper = _write(
        tmp_path,
        "helper.py",
        "from libai.config import LazyConfig\n"
        "def get():\n    return LazyConfig.load_rel('common/train.py', 'train')\n",
    )
    namespace = {"__file__": str(helper)}
    exec(compile(helper.read_text(), str(helper), "exec"), namespace)
    assert namespace["get"]().iters == 10
    with pytest.raises(RuntimeError, match="full path"):
        exec("from libai.config import LazyConfig\nLazyConfig.load_rel('x.py')", {})
    with pytest.raises(FileNotFoundError, match="absent.py"):
        _write(tmp_path, "bad.py", "from libai.config import LazyConfig\n"
               "x = LazyConfig.load_rel('absent.py')\n")  # fmt: skip
        LazyConfig.load(tmp_path / "bad.py")


def test_a_reload_is_not_affected_by_edits_to_an_earlier_load(tmp_path):
    path = _config_tree(tmp_path)
    first = LazyConfig.load(path)
    first.model.cfg.width = 999  # from a relative import
    first.train.nested.lr.append(3)  # from load_rel
    first.train.iters = -1
    again = LazyConfig.load(path)
    assert again.model.cfg.width == 8 and again.train.iters == 100
    assert list(again.train.nested.lr) == [1, 2]
    assert LazyConfig.load(tmp_path / "common/train.py").train.iters == 10
    # packaged configs too
    get_config("common/train.py").train.train_iter = 1
    assert get_config("common/train.py").train.train_iter == 10000


# ----------------------------------------------------------------------------- to_py


def _rich_config():
    cfg = get_config("common/train.py")
    cfg.optim = get_config("common/optim.py").optim
    cfg.lazyobj = L(count)(
        x={"a": 1, "b": 2, "c": L(count)(x={"r": "a", "s": 2.4, "t": [1, 2, 3, "z"]})},
        y="${.x.a}",
    )
    cfg.misc = dict(
        items=["a", 1, None, 3.2, float("inf"), True],
        dtype=torch.bfloat16,
        odd_keys={"a-b": 1, 3: "x", "class": 2},
        shape=Shape(channels=1, width=3),
        point=Point(1, 2),
        fn=make_adder,
        built=L(L(make_adder)(offset=3))(value=4),
    )
    cfg["not-a-name"] = dict(a=1)
    return cfg


def test_to_py_executes_back_to_an_equal_config(tmp_path):
    cfg = _rich_config()
    source = LazyConfig.to_py(cfg, runnable=True)
    compile(source, "<to_py>", "exec")
    namespace = {}
    exec(source, namespace)
    assert named(namespace["cfg"]) == named(cfg)
    assert namespace["cfg"].lazyobj.y == 1  # the interpolation is kept and resolves
    assert isinstance(namespace["cfg"].misc.point, Point)
    assert OmegaConf.get_type(namespace["cfg"].misc.shape) is Shape
    assert instantiate(namespace["cfg"].misc.built) == 7
    assert max(len(line) for line in source.splitlines()) <= 100

    # prefix="" is a config file: LazyConfig.load reads it back equal
    del cfg["not-a-name"]
    path = tmp_path / "printed.py"
    path.write_text(LazyConfig.to_py(cfg, prefix="", runnable=True))
    assert named(LazyConfig.load(path)) == named(cfg)


def test_to_py_text_is_readable_python():
    cfg = OmegaConf.create({"data": {"a": "x", "b": 2}}, flags={"allow_objects": True})
    cfg.lazyobj = L(count)(x={"a": 1, "c": L(count)(x=[1, "z"])}, y="${.x.a}")
    cfg.lazyobj.long = "a long string value that pushes the call past one hundred characters"
    assert LazyConfig.to_py(cfg, runnable=True) == textwrap.dedent(
        """\
        from omegaconf import OmegaConf
        from libai.config import LazyCall as L

        cfg = OmegaConf.create(flags={"allow_objects": True})
        cfg.data = dict(a="x", b=2)
        cfg.lazyobj = L("itertools.count")(
            x=dict(a=1, c=L("itertools.count")(x=[1, "z"])),
            y="${.x.a}",
            long="a long string value that pushes the call past one hundred characters",
        )
        """
    )


def test_to_py_names_the_key_it_cannot_write():
    cfg = OmegaConf.create({"model": {"act": lambda x: x}}, flags={"allow_objects": True})
    with pytest.raises(ValueError, match=r"'model.act'.*\.pkl"):
        LazyConfig.to_py(cfg, runnable=True)
    cfg = OmegaConf.create({"t": {"w": torch.ones(2)}}, flags={"allow_objects": True})
    with pytest.raises(ValueError, match="'t.w'"):
        LazyConfig.to_py(cfg, runnable=True)
    with pytest.raises(ValueError, match="prefix"):
        LazyConfig.to_py(OmegaConf.create({"a": {}}), prefix="cfg", runnable=True)
    with pytest.raises(ValueError, match="'n' is not one"):
        LazyConfig.to_py(OmegaConf.create({"n": 3}), prefix="", runnable=True)


# ----------------------------------------------------------------------------- save with pickle


def _unyamlable_config():
    class Local:
        def __init__(self, scale):
            self.scale = scale

    cfg = get_config("common/optim.py")
    cfg.model = L(Local)(scale=2)  # a local class: no import path
    cfg.extra = dict(act=lambda x: x * 3, weight=torch.arange(3.0), seed="${model.scale}")
    return cfg


def test_save_writes_a_pickle_beside_a_yaml_that_cannot_hold_the_config(tmp_path, caplog):
    cfg = _unyamlable_config()
    yaml_path = tmp_path / "config.yaml"
    with caplog.at_level(logging.WARNING):
        LazyConfig.save(cfg, yaml_path)
    for key in ("model._target_", "extra.act", "extra.weight", "config.yaml.pkl"):
        assert key in caplog.text
    text = yaml_path.read_text()
    assert "torch.optim.AdamW" in text and "<function" in text  # still readable
    loaded = LazyConfig.load(str(yaml_path) + ".pkl")
    assert isinstance(loaded, DictConfig)
    assert loaded.optim == cfg.optim and loaded.extra.seed == 2
    assert instantiate(loaded.model).scale == 2
    assert loaded.extra.act(2) == 6 and torch.equal(loaded.extra.weight, torch.arange(3.0))

    # the same name saved with a config YAML can hold: the stale pickle goes
    LazyConfig.save(get_config("common/optim.py"), yaml_path)
    assert not (tmp_path / "config.yaml.pkl").exists()
    assert named(LazyConfig.load(yaml_path)) == named(get_config("common/optim.py"))

    (tmp_path / "broken.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="broken.pkl"):
        LazyConfig.load(tmp_path / "broken.pkl")


def test_a_config_that_cannot_be_pickled_still_saves_its_yaml(tmp_path, caplog):
    import threading

    cfg = OmegaConf.create({"a": {"lock": threading.Lock(), "n": 1}}, flags={"allow_objects": True})
    with caplog.at_level(logging.WARNING):
        LazyConfig.save(cfg, tmp_path / "c.yaml")
    assert "not saved anywhere else" in caplog.text
    assert not (tmp_path / "c.yaml.pkl").exists()
    assert LazyConfig.load(tmp_path / "c.yaml").a.n == 1


# ----------------------------------------------------------------------------- instantiate


def test_recursive_false_hands_the_target_its_arguments_unbuilt():
    cfg = L(Holder)(
        first=L(Holder)(first=1),
        children=[L(Holder)(first=2)],
        _recursive_=False,
    )
    obj = instantiate(cfg)
    assert isinstance(obj.first, DictConfig) and obj.first._target_ is Holder
    assert instantiate(obj.first).first == 1  # the target can build them when it wants
    assert instantiate(obj.children[0]).first == 2
    # the flag is per node: a recursive parent still builds a non-recursive child's node
    parent = instantiate(L(Holder)(first=L(Holder)(second=L(Holder)(), _recursive_=False)))
    assert isinstance(parent.first, Holder) and isinstance(parent.first.second, DictConfig)
    # given to instantiate, it overrides the node's own flag
    assert isinstance(
        instantiate(L(Holder)(first=L(Holder)()), _recursive_=False).first, DictConfig
    )
    with pytest.raises(TypeError, match="_recursive_ of 'first' must be True or False"):
        instantiate(OmegaConf.create({"first": L(Holder)(_recursive_="no")}).first)


def test_a_lazy_target_is_built_then_called(tmp_path):
    cfg = L(L(make_adder)(offset=3))(value=4)
    assert instantiate(cfg) == 7
    # detectron2's case: the inner target is edited after the node is made
    node = L(L(len)(first=3))(call_arg=4)
    node._target_._target_ = Holder
    with pytest.raises(TypeError, match="not callable"):  # a Holder instance is no callable
        instantiate(node)
    # it saves, reloads and prints like any node
    wrapped = OmegaConf.create({"fn": cfg}, flags={"allow_objects": True})
    LazyConfig.save(wrapped, tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml.pkl").exists()
    assert instantiate(LazyConfig.load(tmp_path / "c.yaml").fn) == 7
    assert "L(L(" in LazyConfig.to_py(wrapped, runnable=True)
    # a failure while building the target names the target's own path
    bad = OmegaConf.create({"fn": L(L("libai.no_such_factory")())()}, flags={"allow_objects": True})
    with pytest.raises(ImportError, match="'fn._target_'"):
        instantiate(bad.fn)
    with pytest.raises(TypeError, match="lazy node"):
        L({"offset": 3})


def test_namedtuple_and_dataclass_targets_and_values_survive_save_and_load(tmp_path):
    cfg = OmegaConf.create(
        {
            "point": L(Point)(x=1, y=2),  # namedtuple target
            "shape": L(Shape)(channels=3),  # dataclass target
            "holder": L(Holder)(first=Shape(channels=1, width=3), second=Point(5, 6)),  # values
        },
        flags={"allow_objects": True},
    )
    assert cfg.point._target_ is Point and cfg.shape._target_ == f"{__name__}.Shape"
    built = instantiate(cfg)
    assert built["point"] == Point(1, 2) and built["shape"] == Shape(3)
    assert built["holder"].first == Shape(1, 3) and built["holder"].second == Point(5, 6)
    assert type(built["holder"].second) is Point

    LazyConfig.save(cfg, tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml.pkl").exists()  # YAML holds them as the nodes that rebuild them
    reloaded = instantiate(LazyConfig.load(tmp_path / "c.yaml"))
    assert reloaded["point"] == built["point"] and reloaded["shape"] == built["shape"]
    assert reloaded["holder"].first == Shape(1, 3) and reloaded["holder"].second == Point(5, 6)

    @dataclass
    class LocalShape:
        side: int = 1

    with pytest.raises(TypeError, match="module level"):
        L(LocalShape)(side=2)
