"""LazyCall / LazyConfig / instantiate / overrides / packaged configs / batch arithmetic."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

import libai
import libai.evaluation
import libai.optim
import libai.scheduler
from libai.config import (
    ConfigKeyError,
    LazyCall,
    LazyConfig,
    OverrideError,
    get_config,
    get_config_path,
    instantiate,
    resolve_batch_sizes,
    resolve_train_iters,
    try_get_key,
)
from libai.dist import DIST_CONFIG_KEYS


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def make(**kwargs):
    """A module-level target for the tests (importable, so saved as its dotted path)."""
    return kwargs


# ----------------------------------------------------------------------------- LazyCall


def test_lazycall_stores_the_target_and_kwargs_and_saves_its_dotted_path(tmp_path):
    node = LazyCall(torch.nn.Linear)(in_features=2, out_features=3)
    assert isinstance(node, DictConfig)
    assert node._target_ is torch.nn.Linear  # the callable, as LiBai's LazyCall keeps it
    assert node.in_features == 2 and node.out_features == 3
    assert LazyCall("libai.evaluation.PPLEvaluator")()._target_ == "libai.evaluation.PPLEvaluator"
    assert LazyCall(dict)(a=1)._target_ == "builtins.dict"  # omegaconf cannot hold the type
    cfg = OmegaConf.create({"m": node, "o": LazyCall(torch.optim.AdamW)()})
    LazyConfig.save(cfg, tmp_path / "c.yaml")
    saved = LazyConfig.load(tmp_path / "c.yaml")
    assert saved.m._target_ == "torch.nn.Linear"  # shortest importable path
    assert saved.o._target_ == "torch.optim.AdamW"


def test_lazycall_keeps_unimportable_target_as_object():
    class Local:
        def __init__(self, x):
            self.x = x

    node = LazyCall(Local)(x=3)
    assert node._target_ is Local
    assert instantiate(node).x == 3


def test_lazycall_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        LazyCall(3)


# ----------------------------------------------------------------------------- instantiate


def test_instantiate_recursive_dicts_and_lists():
    cfg = LazyCall(make)(
        layer=LazyCall(torch.nn.Linear)(in_features=2, out_features=3, bias=False),
        layers=[LazyCall(torch.nn.Linear)(in_features=1, out_features=1), 5],
        plain=dict(a=1, inner=dict(b=[1, 2]), lazy=LazyCall(make)(z=1)),
        tup=(1, 2),
    )
    out = instantiate(cfg)
    assert isinstance(out["layer"], torch.nn.Linear) and out["layer"].bias is None
    assert isinstance(out["layers"], list) and isinstance(out["layers"][0], torch.nn.Linear)
    assert out["layers"][1] == 5
    assert isinstance(out["plain"], dict) and isinstance(out["plain"]["inner"], dict)
    # read by attribute too, as the DictConfig LiBai's instantiate hands over
    assert out["plain"].inner.b == [1, 2] and out["plain"].a == 1
    with pytest.raises(
        AttributeError, match="config has no key 'c'; keys: \\['a', 'inner', 'lazy'\\]"
    ):
        out["plain"].c  # noqa: B018
    assert out["plain"]["inner"]["b"] == [1, 2] and type(out["plain"]["inner"]["b"]) is list
    assert out["plain"]["lazy"] == {"z": 1}
    assert out["tup"] == [1, 2]  # omegaconf stores tuples as lists
    # non-target configs become plain containers; other values pass through
    assert instantiate(OmegaConf.create({"a": {"b": 1}})) == {"a": {"b": 1}}
    assert instantiate(OmegaConf.create([1, {"a": 2}])) == [1, {"a": 2}]
    assert instantiate(7) == 7


def test_instantiate_keyword_overrides_replace_config_values_unbuilt():
    cfg = LazyCall(make)(a=1, b=LazyCall("does.not.exist")())
    assert instantiate(cfg, b=2) == {"a": 1, "b": 2}  # the bad `b` node is never built
    with pytest.raises(TypeError):
        instantiate(OmegaConf.create({"a": 1}), b=2)


def test_instantiate_error_names_config_path_for_bad_target():
    cfg = OmegaConf.create({"model": LazyCall("libai.models.GPTForPreTrainin")(cfg={})})
    with pytest.raises(ImportError) as info:
        instantiate(cfg.model)
    msg = str(info.value)
    assert "while instantiating 'model' (_target_=libai.models.GPTForPreTrainin)" in msg
    assert "libai.models.GPTForPreTraining" in msg  # closest name suggested
    with pytest.raises(ImportError, match="no module named 'nonexistent_pkg_xyz'"):
        instantiate(LazyCall("nonexistent_pkg_xyz.Foo")())


def test_instantiate_error_names_config_path_when_call_raises():
    root = get_config("common/models/gpt.py")
    root.model.cfg.hidden_layer = 2  # typo'd model key: GPTModel's @configurable rejects it
    with pytest.raises(ValueError) as info:
        instantiate(root.model)
    msg = str(info.value)
    assert "while instantiating 'model' (_target_=libai.models.GPTForPreTraining)" in msg
    assert "hidden_layers" in msg  # the model's own hint survives

    # nested: the innermost failing node is named, exactly once
    def boom(**kwargs):
        raise RuntimeError("boom")

    cfg = OmegaConf.create(
        {"optim": LazyCall(make)(params=[1, LazyCall(make)(x=LazyCall(boom)())])},
        flags={"allow_objects": True},
    )
    with pytest.raises(RuntimeError) as info:
        instantiate(cfg.optim)
    assert str(info.value).startswith("while instantiating 'optim.params[1].x'")
    assert str(info.value).count("while instantiating") == 1


# ----------------------------------------------------------------------------- loading .py


def test_load_py_with_relative_imports(tmp_path):
    _write(
        tmp_path,
        "common/train.py",
        """
        from libai.config import LazyCall
        train = dict(train_iter=10, nested=dict(b=[1, 2]), sched=LazyCall(dict)(x=1))
        """,
    )
    _write(
        tmp_path,
        "common/models/m.py",
        """
        from libai.config import LazyCall
        from ..train import train as base_train  # level-2 import inside common/
        cfg = dict(width=4, depth=base_train.train_iter)
        model = LazyCall(dict)(cfg=cfg)
        """,
    )
    _write(
        tmp_path,
        "exps/exp.py",
        """
        import math
        from ..common.train import train
        from ..common.models.m import model
        train.train_iter = 100
        model.cfg.width = 8
        _private = dict(a=1)
        number = 3
        helper = math.sqrt
        extra = [1, 2]
        """,
    )
    cfg = LazyConfig.load(tmp_path / "exps/exp.py")
    assert set(cfg.keys()) == {"train", "model"}  # only configs, no _private / int / list
    assert cfg.train.train_iter == 100 and cfg.train.nested.b == [1, 2]
    assert cfg.model.cfg == {"width": 8, "depth": 10}
    assert cfg.train.sched._target_ == "builtins.dict"
    assert LazyConfig.load(tmp_path / "exps/exp.py", keys="train").train_iter == 100
    train, model = LazyConfig.load(tmp_path / "exps/exp.py", keys=("train", "model"))
    assert model.cfg.width == 8
    # every load executes the files afresh: edits in one config never leak to another
    assert LazyConfig.load(tmp_path / "common/train.py").train.train_iter == 10


def test_load_py_bad_relative_imports(tmp_path):
    _write(tmp_path, "common/train.py", "train = dict(a=1)\n")
    _write(tmp_path, "a.py", "from .common.missing import x\n")
    _write(tmp_path, "b.py", "from .common import train\n")
    _write(tmp_path, "c.py", "from .common.train import nope\n")
    with pytest.raises(ImportError, match="missing.py does not exist"):
        LazyConfig.load(tmp_path / "a.py")
    with pytest.raises(ImportError, match="directory"):
        LazyConfig.load(tmp_path / "b.py")
    with pytest.raises(ImportError, match="nope"):
        LazyConfig.load(tmp_path / "c.py")
    with pytest.raises(FileNotFoundError):
        LazyConfig.load(tmp_path / "absent.py")
    # normal imports are untouched after (and while) loading configs
    import json  # noqa: F401


def test_load_py_honours_all(tmp_path):
    _write(
        tmp_path,
        "exp.py",
        """
        model = dict(a=1)
        train = dict(b=2)
        for loop_var in [dict(c=3)]:
            pass
        __all__ = ["model", "train"]
        """,
    )
    assert set(LazyConfig.load(tmp_path / "exp.py").keys()) == {"model", "train"}
    _write(tmp_path, "bad.py", "model = dict(a=1)\n__all__ = ['model', 'nope']\n")
    with pytest.raises(ValueError, match="nope"):
        LazyConfig.load(tmp_path / "bad.py")


def test_load_rel(tmp_path):
    _write(tmp_path, "base.py", "train = dict(a=1)\n")
    _write(
        tmp_path,
        "exp.py",
        """
        from libai.config import LazyConfig
        train = LazyConfig.load_rel("base.py", "train")
        train.a = 2
        """,
    )
    assert LazyConfig.load(tmp_path / "exp.py").train.a == 2


# ----------------------------------------------------------------------------- packaged configs


def test_packaged_configs_have_libai_shape():
    train = get_config("common/train.py").train
    for key in (
        "output_dir train_iter train_epoch train_micro_batch_size global_batch_size "
        "num_accumulation_steps test_micro_batch_size log_period seed warmup_ratio start_iter "
        "consumed_train_samples consumed_valid_samples train_samples load_weight resume amp "
        "activation_checkpoint zero_optimization checkpointer evaluation scheduler dist"
    ).split():
        assert key in train, key
    assert dict(train.amp) == {
        "enabled": False,
        "dtype": "bf16",
        "init_scale": 65536.0,
        "level": "O1",
        "fp8": None,
        "fp8_min_size": True,
    }
    assert train.activation_checkpoint.enabled is False
    assert dict(train.zero_optimization) == {
        "enabled": False,
        "stage": 1,
        "hsdp_replicate_size": 1,
    }
    assert set(train.checkpointer) == {"period", "max_to_keep"}
    assert train.evaluation.evaluator._target_ == "libai.evaluation.PPLEvaluator"  # named
    assert {"enabled", "eval_period", "eval_iter", "evaluator"} <= set(train.evaluation)
    assert train.scheduler._target_ is libai.scheduler.WarmupCosineLR
    assert dict(train.dist) == DIST_CONFIG_KEYS  # same keys and defaults as the mesh code

    optim = get_config("common/optim.py").optim
    assert optim._target_ is torch.optim.AdamW
    assert optim.params._target_ is libai.optim.get_default_optimizer_params
    assert optim.lr == 1e-4 and optim.weight_decay == 0.01 and list(optim.betas) == [0.9, 0.999]

    graph = get_config("common/models/graph.py").graph
    assert graph.enabled is None and graph.debug == -1  # None: compile on CUDA only

    with pytest.raises(FileNotFoundError, match="common/train.py"):
        get_config("common/trian.py")
    assert get_config_path("common/train.py").endswith("common/train.py")


def test_gpt_model_config_instantiates_and_overrides_change_the_model():
    root = get_config("common/models/gpt.py")
    assert root.model._target_ is libai.models.GPTForPreTraining
    assert root.model.cfg.hidden_layers == 12 and root.model.cfg.vocab_size == 50257
    LazyConfig.apply_overrides(
        root,
        [
            "model.cfg.hidden_layers=2",
            "model.cfg.hidden_size=16",
            "model.cfg.ffn_hidden_size=32",
            "model.cfg.num_attention_heads=2",
            "model.cfg.vocab_size=64",
            "model.cfg.max_seq_length=8",
        ],
    )
    torch.manual_seed(0)
    model = instantiate(root.model)
    assert len(model.GPT_model.transformer.layers) == 2
    out = model(torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8)))
    assert torch.isfinite(out["lm_loss"])


def test_gpt_config_file_edits_of_cfg_reach_the_model(tmp_path):
    gpt = get_config_path("common/models/gpt.py")
    (tmp_path / "common" / "models").mkdir(parents=True)
    (tmp_path / "common" / "models" / "gpt.py").write_text(Path(gpt).read_text())
    _write(
        tmp_path,
        "exp.py",
        """
        from .common.models.gpt import cfg, model
        cfg.hidden_layers = 3
        """,
    )
    assert LazyConfig.load(tmp_path / "exp.py").model.cfg.hidden_layers == 3


# ----------------------------------------------------------------------------- yaml round trip


def _full_config():
    cfg = OmegaConf.create(flags={"allow_objects": True})
    for name in ("common/train.py", "common/optim.py", "common/models/gpt.py"):
        cfg.merge_with(get_config(name))
    cfg.graph = get_config("common/models/graph.py").graph
    cfg.extra = LazyCall(make)(
        items=[LazyCall(torch.nn.Linear)(in_features=1, out_features=2), [1, 2.5, None], "s"],
        nested=dict(lazy=LazyCall(make)(t=(1, 2)), flag=True, neg=-3, tiny=1e-12),
        seed="${train.seed}",
        target_obj=LazyCall(torch.nn.ReLU)(),
    )
    cfg.extra.nested.callable_target = LazyCall(make)()
    cfg.extra.nested.callable_target._target_ = make  # object target: saved as its path
    return cfg


def test_yaml_round_trip_is_equal(tmp_path):
    cfg = _full_config()
    LazyConfig.save(cfg, tmp_path / "config.yaml")
    loaded = LazyConfig.load(tmp_path / "config.yaml")
    expected = _full_config()
    LazyConfig.save(expected, tmp_path / "expected.yaml")  # callables become dotted paths
    assert loaded == LazyConfig.load(tmp_path / "expected.yaml")
    assert loaded.extra.nested.callable_target._target_ == f"{make.__module__}.make"
    assert loaded.extra.seed == cfg.train.seed  # interpolation kept, still resolves
    assert OmegaConf.to_container(loaded.extra, resolve=False)["seed"] == "${train.seed}"
    # the loaded config is usable: save again gives the same text; objects instantiate
    LazyConfig.save(loaded, tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_text() == (tmp_path / "config.yaml").read_text()
    built = instantiate(loaded.extra)
    assert isinstance(built["items"][0], torch.nn.Linear) and built["seed"] == 1234
    assert isinstance(loaded, DictConfig) and isinstance(loaded.extra["items"], ListConfig)


def test_yaml_save_warns_on_values_yaml_cannot_hold(tmp_path, caplog):
    cfg = OmegaConf.create({"a": {"obj": object()}}, flags={"allow_objects": True})
    with caplog.at_level(logging.WARNING):
        LazyConfig.save(cfg, tmp_path / "c.yaml")
    assert "a.obj" in caplog.text
    assert LazyConfig.load(tmp_path / "c.yaml").a.obj.startswith("<object")


# ----------------------------------------------------------------------------- overrides


def test_overrides_are_typed():
    cfg = get_config("common/train.py")
    LazyConfig.apply_overrides(
        cfg,
        [
            "train.train_iter=7",
            "train.dist.tensor_parallel_size=2",
            "train.warmup_ratio=0.25",
            "train.amp.enabled=true",
            "train.dist.custom_pipeline_stage_id=[0,0,1]",
            "train.output_dir='runs/my run, 1'",
            "train.load_weight=path/to/w",
            "train.dist.device_type=null",
            "train.evaluation.evaluator=null",
            "train.scheduler.alpha=1e-3",
            "train.checkpointer={period:3}",
        ],
    )
    t = cfg.train
    assert t.train_iter == 7 and type(t.train_iter) is int
    assert t.dist.tensor_parallel_size == 2
    assert t.warmup_ratio == 0.25 and type(t.warmup_ratio) is float
    assert t.amp.enabled is True and t.amp.dtype == "bf16"
    assert list(t.dist.custom_pipeline_stage_id) == [0, 0, 1]
    assert t.output_dir == "runs/my run, 1"
    assert t.load_weight == "path/to/w"
    assert t.dist.device_type is None
    assert t.evaluation.evaluator is None
    assert t.scheduler.alpha == 1e-3
    assert dict(t.checkpointer) == {"period": 3, "max_to_keep": 100}  # dicts merge


def test_override_typo_names_closest_keys():
    cfg = get_config("common/train.py")
    with pytest.raises(ConfigKeyError) as info:
        LazyConfig.apply_overrides(cfg, ["train.dist.tensor_paralel_size=2"])
    msg = str(info.value)
    assert "did you mean train.dist.tensor_parallel_size" in msg.lower()
    assert "+train.dist.tensor_paralel_size=2" in msg  # says how to add a key on purpose
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(ConfigKeyError, match="train.train_iter"):
        LazyConfig.apply_overrides(cfg, ["trian.train_iter=2"])
    with pytest.raises(ConfigKeyError, match="train.dist"):
        LazyConfig.apply_overrides(cfg, ["train.dsit.tensor_parallel_size=2"])
    assert "tensor_paralel_size" not in cfg.train.dist  # nothing was added


def test_override_add_force_add_delete_and_bad_input():
    cfg = get_config("common/train.py")
    LazyConfig.apply_overrides(
        cfg, ["+train.new_key=1", "+train.new.deep=[1,2]", "++train.seed=5", "++train.other=x"]
    )
    assert cfg.train.new_key == 1 and list(cfg.train.new.deep) == [1, 2]
    assert cfg.train.seed == 5 and cfg.train.other == "x"
    LazyConfig.apply_overrides(cfg, ["~train.other"])
    assert "other" not in cfg.train
    with pytest.raises(ConfigKeyError, match="already exists"):
        LazyConfig.apply_overrides(cfg, ["+train.seed=1"])
    with pytest.raises(ConfigKeyError):
        LazyConfig.apply_overrides(cfg, ["~train.nope"])
    with pytest.raises(OverrideError, match="cannot parse"):
        LazyConfig.apply_overrides(cfg, ["train.seed"])
    with pytest.raises(OverrideError, match="sweep"):
        LazyConfig.apply_overrides(cfg, ["train.seed=1,2"])
    with pytest.raises(OverrideError, match="not a config node"):
        LazyConfig.apply_overrides(cfg, ["train.seed.x=1"])


def test_try_get_key():
    cfg = get_config("common/train.py")
    assert try_get_key(cfg, "train.nope", "train.seed") == 1234
    assert try_get_key(cfg, "train.global_batch_size", default=3) is None  # None is a value
    assert try_get_key(cfg, "a.b", default=3) == 3


# ----------------------------------------------------------------------------- batch arithmetic


def _train(micro, glob, acc):
    return OmegaConf.create(
        dict(train_micro_batch_size=micro, global_batch_size=glob, num_accumulation_steps=acc)
    )


@pytest.mark.parametrize(
    "micro, glob, acc, dp, expected",
    [
        (4, None, None, 2, (4, 8, 1)),  # global derived, acc defaults to 1
        (4, None, 3, 2, (4, 24, 3)),  # global derived from all three
        (4, 16, None, 2, (4, 16, 2)),  # accumulation derived
        (None, 16, None, 2, (8, 16, 1)),  # micro derived, acc defaults to 1
        (None, 16, 4, 2, (2, 16, 4)),  # micro derived
        (4, 16, 2, 2, (4, 16, 2)),  # consistent triple
    ],
)
def test_resolve_batch_sizes_derives_the_missing_one(micro, glob, acc, dp, expected):
    sizes = resolve_batch_sizes(_train(micro, glob, acc), dp)
    assert tuple(sizes) == expected
    assert (
        sizes.global_batch_size == sizes.train_micro_batch_size * dp * sizes.num_accumulation_steps
    )


def test_resolve_batch_sizes_errors_name_the_keys():
    with pytest.raises(
        ValueError,
        match=r"train.num_accumulation_steps=1 contradicts the batch sizes: "
        r"train.global_batch_size 16 / \(train.train_micro_batch_size 4 x 2 data-parallel ranks\) "
        r"= 2 micro-batches per step",
    ):
        resolve_batch_sizes(_train(4, 16, 1), 2)
    with pytest.raises(ValueError, match=r"global_batch_size=10 is not divisible.*micro"):
        resolve_batch_sizes(_train(4, 10, None), 2)
    with pytest.raises(ValueError, match=r"global_batch_size=10 is not divisible.*4"):
        resolve_batch_sizes(_train(None, 10, 2), 2)
    with pytest.raises(ValueError, match="train_micro_batch_size or train.global_batch_size"):
        resolve_batch_sizes(_train(None, None, 2), 1)
    with pytest.raises(ValueError, match="num_accumulation_steps must be a positive"):
        resolve_batch_sizes(_train(4, None, 0), 1)
    # the packaged defaults resolve
    assert tuple(resolve_batch_sizes(get_config("common/train.py").train, 1)) == (32, 32, 1)


def test_resolve_train_iters_epochs_and_warmup():
    t = OmegaConf.create(dict(train_iter=10, train_epoch=0, warmup_ratio=0.1, global_batch_size=8))
    assert tuple(resolve_train_iters(t)) == (10, 1)
    t.train_epoch = 2
    # LiBai: ceil(samples * epochs / global) = ceil(100 * 2 / 8) = 25 > 10
    assert tuple(resolve_train_iters(t, samples_per_epoch=100)) == (25, 3)
    t.train_iter = 40  # the larger one wins
    assert tuple(resolve_train_iters(t, samples_per_epoch=100)) == (40, 4)
    assert resolve_train_iters(t, samples_per_epoch=100, global_batch_size=1).train_iter == 200
    with pytest.raises(ValueError, match="samples_per_epoch"):
        resolve_train_iters(t)
    t.warmup_ratio = 1.0
    with pytest.raises(ValueError, match="warmup_ratio"):
        resolve_train_iters(t, samples_per_epoch=100)
    with pytest.raises(ValueError, match="train_iter or train.train_epoch"):
        resolve_train_iters(OmegaConf.create(dict(train_iter=0, train_epoch=0)))
