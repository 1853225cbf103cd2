"""Rapidformer door defaults against their references: the output directory the guide
documents, the pipeline layer count of a Hugging Face config as transformers counts it,
the offline switches ``huggingface_hub`` and ``datasets`` read, and Megatron's names
pointing at the flags they stand for."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import transformers

from libai.accelerate.arguments import build_parser
from libai.accelerate.engine import _layer_count
from libai.accelerate.hub_data import _offline, offline_by_default
from libai.accelerate.megatron_args import ALIASES, set_megatron_names

ROOT = Path(__file__).resolve().parents[3]


def test_save_default_is_the_documented_output_directory():
    """``--save`` left out: the run writes where docs/accelerate.md says it does."""
    guide = (ROOT / "docs" / "accelerate.md").read_text(encoding="utf-8")
    documented = re.search(r"under `--save` \(default `([^`]+)`\)", guide).group(1)
    assert build_parser().get_default("save") == documented


@pytest.mark.parametrize(
    "config",
    [
        transformers.T5Config(num_layers=2, num_decoder_layers=3),
        transformers.T5Config(num_layers=2),
        transformers.GPT2Config(n_layer=3),
        transformers.BertConfig(num_hidden_layers=4),
    ],
    ids=["t5-3-decoder-layers", "t5-default-decoder", "gpt2", "bert"],
)
def test_pipeline_layer_count_is_transformers_own(config, tmp_path):
    """The layers pipeline stages are cut from: an encoder-decoder counts its encoder's and
    its decoder's (``num_decoder_layers`` when the config sets it, transformers' default of
    ``num_layers`` otherwise); a decoder-only or encoder-only model its blocks."""
    config.save_pretrained(tmp_path)
    if isinstance(config, transformers.T5Config):
        want = config.num_layers + config.num_decoder_layers
    else:
        want = config.num_hidden_layers
    assert _layer_count(str(tmp_path)) == want


@pytest.mark.parametrize(
    ("hub", "datasets_flag", "want"),
    [(None, None, ("1", "1")), ("0", None, ("0", "0")), ("1", "0", ("1", "0"))],
    ids=["unset", "user-online", "datasets-own"],
)
def test_offline_by_default_sets_the_variables_hub_and_datasets_read(
    monkeypatch, hub, datasets_flag, want
):
    """Offline unless the user says otherwise: ``HF_HUB_OFFLINE`` (huggingface_hub's switch)
    defaults to 1 and ``HF_DATASETS_OFFLINE`` (datasets' own) follows it; a value the user
    set is kept."""
    for name, value in (("HF_HUB_OFFLINE", hub), ("HF_DATASETS_OFFLINE", datasets_flag)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    offline_by_default()
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["HF_DATASETS_OFFLINE"]) == want


def test_each_megatron_name_says_which_flag_it_stands_for():
    """``--mask-prob`` and the other Megatron spellings: the help names a flag of the parser
    that sets the same value."""
    parser = build_parser()
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    for megatron, ours in ALIASES.items():
        alias = by_flag["--" + megatron.replace("_", "-")]
        named = re.fullmatch(r"the same as (--[a-z0-9-]+)", alias.help).group(1)
        assert by_flag[named].dest == alias.dest == ours, megatron


@pytest.mark.parametrize(
    "value", ["1", "true", "TRUE", "yes", "Yes", "on", "ON", "0", "false", "no", "off", ""]
)
def test_hub_offline_reads_the_variable_as_huggingface_hub_does(monkeypatch, value):
    """Whether a Hub id may be downloaded: ``HF_HUB_OFFLINE`` read with huggingface_hub's own
    rule (its ``constants._is_true``), so the door and the library never disagree."""
    from huggingface_hub.constants import _is_true

    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert _offline() is _is_true(value)


@pytest.mark.parametrize(
    ("env", "want"), [({}, (0, 1)), ({"RANK": "3", "WORLD_SIZE": "4"}, (3, 4))]
)
def test_megatron_rank_and_world_size_come_from_the_launcher(monkeypatch, env, want):
    """``get_args().rank`` / ``.world_size`` as Megatron sets them in its initialisation:
    ``int(os.getenv('RANK', '0'))`` and ``int(os.getenv('WORLD_SIZE', '1'))``."""
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = set_megatron_names(build_parser().parse_args([]))
    assert (args.rank, args.world_size) == want
