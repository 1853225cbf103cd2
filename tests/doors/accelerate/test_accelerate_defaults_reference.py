"""Rapidformer door defaults against their references: the output directory the guide
documents, and the pipeline layer count of a Hugging Face config as transformers counts it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers

from libai.accelerate.arguments import build_parser
from libai.accelerate.engine import _layer_count

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
