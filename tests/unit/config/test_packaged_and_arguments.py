"""Where packaged configs are looked up (beside the module, else next to the package) and
the training command line's flags, each against a hand-built layout or text."""

from __future__ import annotations

import os

import pytest

import libai.config.packaged as packaged
from libai.config import default_argument_parser, get_config_path


def _layout(tmp_path, monkeypatch, beside: bool, checkout: bool):
    """A fake install: ``<tmp>/libai/config/packaged.py`` with the chosen configs folders."""
    here = tmp_path / "libai" / "config"
    here.mkdir(parents=True)
    for make, root in ((beside, here / "configs"), (checkout, tmp_path / "configs")):
        if make:
            (root / "common").mkdir(parents=True)
            (root / "common" / "train.py").write_text("train = dict()\n")
            (root / "a.yaml").write_text("a: 1\n")
            (root / "notes.txt").write_text("not a config\n")
    monkeypatch.setattr(packaged, "__file__", str(here / "packaged.py"))
    return here


def test_the_configs_beside_the_module_come_first(tmp_path, monkeypatch):
    here = _layout(tmp_path, monkeypatch, beside=True, checkout=True)
    assert get_config_path("common/train.py") == os.fspath(here / "configs/common/train.py")


def test_else_the_configs_next_to_the_package(tmp_path, monkeypatch):
    _layout(tmp_path, monkeypatch, beside=False, checkout=True)
    assert get_config_path("common/train.py") == os.fspath(tmp_path / "configs/common/train.py")


def test_a_missing_config_lists_the_available_ones(tmp_path, monkeypatch):
    _layout(tmp_path, monkeypatch, beside=False, checkout=True)
    with pytest.raises(FileNotFoundError) as info:
        get_config_path("common/trian.py")
    assert str(info.value) == (
        "common/trian.py is not a config packaged with libai; available: a.yaml, common/train.py"
    )


def test_no_configs_folder_at_all(tmp_path, monkeypatch):
    _layout(tmp_path, monkeypatch, beside=False, checkout=False)
    with pytest.raises(FileNotFoundError, match="configs directory was not found"):
        get_config_path("common/train.py")


def test_the_command_line_flags():
    parser = default_argument_parser()
    args = parser.parse_args(["--config-file", "c.py", "--resume", "a.b=1", "c=[1,2]"])
    assert args.config_file == "c.py" and args.resume and not args.eval_only
    assert args.opts == ["a.b=1", "c=[1,2]"] and not args.fast_dev_run
    with pytest.raises(SystemExit):  # --config-file is required
        parser.parse_args(["--resume"])
    text = parser.format_help()
    assert "--config-file FILE  path to config file" in text
    assert text.endswith(
        "\nExample: bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py 2 "
        "train.dist.tensor_parallel_size=2\n"
    )
    # an epilog of its own, kept as written (not re-wrapped)
    custom = default_argument_parser("first line\n  second line").format_help()
    assert custom.endswith("\nfirst line\n  second line\n")


def test_every_flag_says_what_it_does():
    # the help line of each flag, as a user reads it in --help (whitespace folded: the
    # wrapping depends on the terminal)
    text = " ".join(default_argument_parser().format_help().split())
    for line in (
        "--resume resume from the last checkpoint in output_dir",
        "--eval-only evaluate the loaded weights only",
        "--fast-dev-run a few iterations with frequent logging, evaluation and checkpoints "
        "(smoke test)",
        "opts config overrides in Hydra's grammar, e.g. train.train_iter=100",
    ):
        assert line in text


def test_get_config_reads_a_libai_checkouts_own_file_first(tmp_path, monkeypatch):
    """Run from a LiBai checkout (its configs/common/...), get_config loads the checkout's
    file, as LiBai's does; elsewhere the packaged one."""
    from libai.config import get_config

    packaged_train = get_config("common/train.py")
    checkout = tmp_path / "configs" / "common"
    checkout.mkdir(parents=True)
    (checkout / "train.py").write_text("train = dict(only_here=1)\n")
    monkeypatch.chdir(tmp_path)
    assert dict(get_config("common/train.py").train) == {"only_here": 1}
    assert "only_here" not in packaged_train.train
    assert "optim" in get_config("common/optim.py")  # not in the checkout: the packaged one
