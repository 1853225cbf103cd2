"""``import oneflow`` / ``import flowvision`` inside config files (which name maps to what,
and the exact message for one that does not), and the ``${libai_sample:KEY}`` paths under
each environment setting, written out by hand."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf

from libai.config.oneflow_names import (
    FLOWVISION_NAMES,
    UnmappedNameError,
    _unmapped,
    config_module,
)
from libai.config.resolvers import default_sample_data_dir, sample_path
from libai.data import transforms
from libai.data.mixup import Mixup

ONEFLOW_MAPPED = (
    "oneflow.optim.AdamW, oneflow.optim.Adam, oneflow.optim.SGD, oneflow.optim.LAMB, "
    "oneflow.<dtype>, oneflow.nn.<module>"
)


def _oneflow_message(name):
    return (
        f"{name} (OneFlow, in a config file) has no mapping onto torch here; mapped: "
        f"{ONEFLOW_MAPPED}. Replace it with its torch name in the config."
    )


def _flowvision_message(name):
    mapped = ", ".join(f"flowvision.{k}" for k in FLOWVISION_NAMES)
    return (
        f"{name} (flowvision, in a config file) has no mapping onto libai here; mapped: "
        f"{mapped}. Replace it with a libai or torch name in the config."
    )


def test_unmapped_messages_list_what_is_mapped():
    assert _unmapped("oneflow.optim.RMSprop") == _oneflow_message("oneflow.optim.RMSprop")
    assert "flowvision.transforms.Compose, flowvision.transforms.RandomResizedCrop" in (
        _unmapped("flowvision.nope")
    )
    assert _unmapped("flowvision.nope") == _flowvision_message("flowvision.nope")


@pytest.mark.parametrize(
    "module, attr, message",
    [
        ("oneflow.optim", "Linear", _oneflow_message("oneflow.optim.Linear")),  # only under nn
        ("oneflow", "Linear", _oneflow_message("oneflow.Linear")),
        ("oneflow", "functional", _oneflow_message("oneflow.functional")),
        ("flowvision", "nope", _flowvision_message("flowvision.nope")),
        ("flowvision.data", "Nope", _flowvision_message("flowvision.data.Nope")),
    ],
)
def test_an_unmapped_attribute_is_named(module, attr, message):
    with pytest.raises(UnmappedNameError) as info:
        getattr(config_module(module), attr)
    assert str(info.value) == message


def test_mapped_names():
    flow = config_module("oneflow")
    assert flow.optim.SGD == "torch.optim.SGD" and flow.bfloat16 is torch.bfloat16
    assert flow.nn.Linear is torch.nn.Linear
    assert config_module("oneflow.optim").AdamW == "libai.optim.oneflow_optim.AdamW"
    vision = config_module("flowvision")
    assert vision.transforms.Compose is transforms.Compose
    assert vision.data.Mixup is Mixup and vision.data.mixup.Mixup is Mixup
    assert config_module("flowvision.data.mixup").Mixup is Mixup
    assert config_module("flowvision.data").mixup.__name__ == "flowvision.data.mixup"


def test_dunder_lookups_are_attribute_errors():
    # Python's machinery probes modules for dunders (hasattr, copy, inspect): never an ImportError
    flow = config_module("oneflow")
    assert not hasattr(flow, "__wrapped__") and getattr(flow, "__path__", None) is None
    assert not hasattr(config_module("flowvision.data"), "__wrapped__")


def test_import_of_a_module_that_is_not_one():
    with pytest.raises(UnmappedNameError) as info:
        config_module("oneflow.nope")
    assert str(info.value) == _oneflow_message("oneflow.nope")
    with pytest.raises(UnmappedNameError) as info:
        config_module("oneflow.optim.AdamW.x")
    assert (
        str(info.value) == "oneflow.optim.AdamW.x is not a package (OneFlow name in a config file)"
    )
    with pytest.raises(UnmappedNameError) as info:
        config_module("flowvision.transforms.Compose.x")
    assert str(info.value) == (
        "flowvision.transforms.Compose.x is not a package (OneFlow name in a config file)"
    )


# ----------------------------------------------------------------------------- ${libai_sample:}


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in ("LIBAI_SAMPLE_DATA_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_the_sample_directory_under_each_setting(env, tmp_path):
    home_dir = os.path.join(str(tmp_path), "home", ".cache", "libai", "sample_gpt2")
    assert default_sample_data_dir() == home_dir
    env.setenv("LIBAI_SAMPLE_DATA_DIR", "")  # empty: not set
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_sample_data_dir() == os.path.join(str(tmp_path), "xdg", "libai", "sample_gpt2")
    env.setenv("LIBAI_SAMPLE_DATA_DIR", "rel/samples")  # relative to the working directory
    assert default_sample_data_dir() == os.path.join(str(tmp_path), "rel", "samples")


def test_sample_paths_of_each_key(env, tmp_path):
    env.setenv("LIBAI_SAMPLE_DATA_DIR", str(tmp_path / "s"))
    root = str(tmp_path / "s")
    expected = {
        "data_dir": root,
        "vocab_file": os.path.join(root, "gpt2-vocab.json"),
        "merges_file": os.path.join(root, "gpt2-merges.txt"),
        "data_prefix": os.path.join(root, "stdlib_text_document"),
        "corpus": os.path.join(root, "stdlib_corpus.jsonl"),
    }
    assert {key: sample_path(key) for key in expected} == expected
    cfg = OmegaConf.create({"v": "${libai_sample:vocab_file}", "d": "${libai_sample:data_dir}"})
    assert cfg.v == expected["vocab_file"] and cfg.d == root
    with pytest.raises(ValueError, match="unknown key 'vocab'"):
        sample_path("vocab")


def test_register_resolvers_registers_once(env, tmp_path):
    from libai.config.resolvers import register_resolvers

    env.setenv("LIBAI_SAMPLE_DATA_DIR", str(tmp_path))
    cfg = OmegaConf.create({"v": "${libai_sample:corpus}"})
    OmegaConf.clear_resolver("libai_sample")
    try:
        register_resolvers()
        register_resolvers()  # again: no "already registered" error
        assert cfg.v == os.path.join(str(tmp_path), "stdlib_corpus.jsonl")
    finally:
        if not OmegaConf.has_resolver("libai_sample"):
            OmegaConf.register_new_resolver("libai_sample", sample_path)
