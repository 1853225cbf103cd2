"""Users' files are sacred (DESIGN.md, decision 11): the built-in sample dataset is built only in
our cache directory, only when a config asks for it explicitly (``${libai_sample:...}``, or null
paths in the FleetX YAMLs), never because a user's files are called ``gpt2-vocab.json``; and a
user's data directory is byte-identical after a run through every front door."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import run_tool, tiny_gpt_yaml_run
from train_net_helpers import ROOT, TINY, read_metrics, run_train_net, train_env

from libai.config import LazyConfig
from libai.data import sample_corpus

GPT2_PRETRAIN = ROOT / "configs" / "gpt2_pretrain.py"
GPT_YAML = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
#: the user's own files, named exactly like the sample dataset's
USER_FILES = [
    "gpt2-vocab.json",
    "gpt2-merges.txt",
    "stdlib_text_document.bin",
    "stdlib_text_document.idx",
    "stdlib_corpus.jsonl",
]
#: projects/gpt's YAML, tiny and quick (as in test_engine_gpt.py), 2 steps
YAML_TINY = [*tiny_gpt_yaml_run(2), "Optimizer.name=AdamW"]


# ---- helpers ------------------------------------------------------------------------------------
def snapshot(root) -> dict[str, str]:
    """Every path under ``root`` (hidden ones and directories included) -> its sha256, so two
    snapshots are equal iff the listing and every file's bytes are."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in dirnames:
            out[f"{rel / name}/"] = "directory"
        for name in filenames:
            out[str(rel / name)] = hashlib.sha256(Path(dirpath, name).read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def built_user_data(tmp_path_factory):
    """A small GPT-2 corpus with the sample's file names, made with the sample builder and then
    stripped of our marker: to the library, it is someone's own data."""
    data_dir = tmp_path_factory.mktemp("built_user_data")
    sample_corpus.ensure_sample_dataset(str(data_dir), max_bytes=200_000, vocab_size=1000)
    for name in ("sample_dataset.json", ".lock"):
        (data_dir / name).unlink()
    assert sorted(os.listdir(data_dir)) == sorted(USER_FILES)
    return data_dir


@pytest.fixture
def user_data(built_user_data, tmp_path):
    """This test's copy of the user's data directory, and its snapshot before the test."""
    data_dir = tmp_path / "my_data"
    shutil.copytree(built_user_data, data_dir)
    return data_dir, snapshot(data_dir)


def user_paths(data_dir) -> dict[str, str]:
    return {
        "vocab_file": str(data_dir / "gpt2-vocab.json"),
        "merges_file": str(data_dir / "gpt2-merges.txt"),
        "data_prefix": str(data_dir / "stdlib_text_document"),
    }


def isolated_env(tmp_path, **extra) -> dict:
    """:func:`train_env` with the sample cache at ``tmp_path/cache`` and ``$XDG_CACHE_HOME`` at
    ``tmp_path/xdg`` (whose ``libai/`` would be the default cache): a build lands in sight."""
    env = {
        "LIBAI_SAMPLE_DATA_DIR": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return train_env(**{**env, **extra})


# ---- the LiBai door: tools/train_net.py -------------------------------------------------------
def test_train_net_on_the_users_own_files_writes_nothing_to_them(user_data, tmp_path):
    data_dir, before = user_data
    paths = user_paths(data_dir)
    out = tmp_path / "out"
    run_train_net(
        GPT2_PRETRAIN,
        [
            *TINY,
            "train.train_iter=2",
            "train.evaluation.enabled=False",
            f"train.output_dir={out}",
            f"tokenization.tokenizer.vocab_file={paths['vocab_file']}",
            f"tokenization.tokenizer.merges_file={paths['merges_file']}",
            f"dataloader.train.dataset.0.data_prefix={paths['data_prefix']}",
        ],
        env=isolated_env(tmp_path),
        timeout=120,
    )
    assert snapshot(data_dir) == before
    # no sample was asked for, so none was built, anywhere
    assert not (tmp_path / "cache").exists() and not (tmp_path / "xdg" / "libai").exists()
    # it trained on the user's 1000-token vocabulary, padded to 1024 (the sample's is 8192)
    assert "vocab_size: 1024" in (out / "config.yaml").read_text()


def test_train_net_builds_the_sample_vocab_in_the_cache_only(user_data, tmp_path):
    """The user's data prefix with the config's sample vocabulary: the sample is still asked for
    (``${libai_sample:vocab_file}``) and built in ``$LIBAI_SAMPLE_DATA_DIR``, nowhere else."""
    data_dir, before = user_data
    out = tmp_path / "out"
    run_train_net(
        GPT2_PRETRAIN,
        [
            *TINY,
            "train.train_iter=2",
            "train.evaluation.enabled=False",
            f"train.output_dir={out}",
            f"dataloader.train.dataset.0.data_prefix={user_paths(data_dir)['data_prefix']}",
        ],
        env=isolated_env(tmp_path),
        timeout=120,
    )
    assert snapshot(data_dir) == before
    cache = tmp_path / "cache"
    assert sample_corpus.is_sample_dataset_ready(str(cache))
    assert not list(cache.glob(".build-*")) and not (cache / ".sample_dataset.partial").exists()
    assert not (tmp_path / "xdg" / "libai").exists()
    # the saved config keeps the request, and loads back where the resolver is registered
    text = (out / "config.yaml").read_text()
    assert "${libai_sample:vocab_file}" in text and "vocab_size: 8192" in text
    cfg = LazyConfig.load(str(out / "config.yaml"))
    assert sample_corpus.uses_sample_data(cfg)
    convert = [sys.executable, str(ROOT / "tools" / "convert_checkpoint.py"), "to-hf"]
    convert += ["--checkpoint", str(out / "model_final"), "--config-file", str(out / "config.yaml")]
    proc = subprocess.run(
        [*convert, "--output", str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        env=isolated_env(tmp_path),
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and (tmp_path / "hf" / "config.json").exists(), proc.stderr[-3000:]


# ---- the FleetX door: tools/train.py with GPTModule and GPTDataset ------------------------------
def test_fleetx_gpt_on_the_users_own_files_writes_nothing_to_them(user_data, tmp_path):
    data_dir, before = user_data
    paths = user_paths(data_dir)
    out = tmp_path / "out"
    run_tool(
        "train",
        GPT_YAML,
        *YAML_TINY,
        f"Engine.save_load.output_dir={out}",
        f"Model.tokenizer.vocab_file={paths['vocab_file']}",
        f"Model.tokenizer.merges_file={paths['merges_file']}",
        f"Data.Train.dataset.data_prefix={paths['data_prefix']}",
        env=isolated_env(tmp_path),
        timeout=120,
    )
    assert snapshot(data_dir) == before
    assert not (tmp_path / "cache").exists() and not (tmp_path / "xdg" / "libai").exists()
    # an untrained model's first loss is ~ln(vocab): the user's 1024 (padded), not 8192
    assert abs(read_metrics(out)[0]["total_loss"] - math.log(1024)) < 0.5


def test_fleetx_gpt_tokenizer_needs_both_files_or_neither(user_data, tmp_path, monkeypatch):
    from libai.fleetx.modules.gpt import _gpt2_tokenizer

    data_dir, before = user_data
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="give both vocab_file and merges_file"):
        _gpt2_tokenizer(vocab_file=user_paths(data_dir)["vocab_file"])
    tokenizer = _gpt2_tokenizer(**{k: v for k, v in user_paths(data_dir).items() if "file" in k})
    assert len(tokenizer) == 1000
    assert snapshot(data_dir) == before and not (tmp_path / "cache").exists()


def test_gpt_split_on_the_users_own_prefix_writes_nothing(user_data, tmp_path, monkeypatch):
    from libai.data.datasets.gpt_split import GPTDataset

    data_dir, before = user_data
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", str(tmp_path / "cache"))
    dataset = GPTDataset(
        data_prefix=user_paths(data_dir)["data_prefix"], max_seq_length=32, num_samples=8
    )
    assert len(dataset) >= 8
    assert snapshot(data_dir) == before
    assert not (tmp_path / "cache").exists()


# ---- the builder itself ------------------------------------------------------------------------
@pytest.mark.parametrize("force", [False, True])
def test_ensure_sample_dataset_refuses_a_directory_of_foreign_files(user_data, force):
    data_dir, before = user_data
    with pytest.raises(ValueError) as err:
        sample_corpus.ensure_sample_dataset(str(data_dir), max_bytes=200_000, force=force)
    message = str(err.value)
    assert "\n" not in message and str(data_dir) in message and "LIBAI_SAMPLE_DATA_DIR" in message
    assert all(name in message for name in USER_FILES)
    assert snapshot(data_dir) == before  # not even a lock file


def test_a_single_foreign_file_is_refused_and_kept(tmp_path):
    data_dir = tmp_path / "mine"
    data_dir.mkdir()
    (data_dir / "gpt2-merges.txt").write_text("#version: mine\n")
    (data_dir / "notes.txt").write_text("my notes\n")
    before = snapshot(data_dir)
    with pytest.raises(ValueError, match=r"holds gpt2-merges\.txt but no sample_dataset\.json"):
        sample_corpus.ensure_sample_dataset(str(data_dir), max_bytes=200_000)
    assert snapshot(data_dir) == before


def test_force_rebuilds_only_our_own_build_and_an_interrupted_one(tmp_path, monkeypatch):
    """A directory with our marker (complete, or the partial marker of a build cut off while
    moving its files in) is ours to rebuild; without a marker it is not."""
    calls = []
    ready = {"documents": 0, "tokens": 0, "vocab_size": 0, "build_seconds": 0.0}
    monkeypatch.setattr(sample_corpus, "_build", lambda d, *a: calls.append(d) or ready)
    ours = tmp_path / "ours"
    ours.mkdir()
    for name in USER_FILES:
        (ours / name).write_text("ours")
    (ours / ".sample_dataset.partial").touch()
    sample_corpus.ensure_sample_dataset(str(ours))  # interrupted: rebuilt
    (ours / ".sample_dataset.partial").unlink()
    (ours / "sample_dataset.json").write_text("{}")
    sample_corpus.ensure_sample_dataset(str(ours), force=True)  # complete, forced: rebuilt
    assert calls == [str(ours), str(ours)]
    (ours / "sample_dataset.json").unlink()
    with pytest.raises(ValueError, match="Refusing"):
        sample_corpus.ensure_sample_dataset(str(ours), force=True)
    assert len(calls) == 2


# ---- configs ------------------------------------------------------------------------------------
def test_the_sample_request_is_explicit_and_survives_config_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", str(tmp_path / "cache"))
    cfg = LazyConfig.load(str(ROOT / "configs" / "common" / "data" / "gpt_dataset.py"))
    assert sample_corpus.uses_sample_data(cfg)
    LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    assert "${libai_sample:data_prefix}" in (tmp_path / "config.yaml").read_text()
    # a new process (as tools/convert_checkpoint.py loads a run's config.yaml), another cache
    code = (
        "from libai.config import LazyConfig; "
        f"cfg = LazyConfig.load({str(tmp_path / 'config.yaml')!r}); "
        "print(cfg.tokenization.tokenizer.vocab_file); "
        "print(cfg.dataloader.train.dataset[0].indexed_dataset.data_prefix)"
    )
    env = isolated_env(tmp_path, LIBAI_SAMPLE_DATA_DIR=str(tmp_path / "elsewhere"))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert proc.stdout.split() == [
        str(tmp_path / "elsewhere" / "gpt2-vocab.json"),
        str(tmp_path / "elsewhere" / "stdlib_text_document"),
    ]
    # the user's own paths, whatever their names, ask for nothing
    mine = [
        f"tokenization.tokenizer.vocab_file={tmp_path}/gpt2-vocab.json",
        f"tokenization.tokenizer.merges_file={tmp_path}/gpt2-merges.txt",
        f"dataloader.train.dataset.0.data_prefix={tmp_path}/stdlib_text_document",
    ]
    cfg = LazyConfig.apply_overrides(cfg, mine)
    assert not sample_corpus.uses_sample_data(cfg)
    assert sample_corpus.prepare_sample_data(cfg) is None
    assert not (tmp_path / "cache").exists()
