"""Reference checks for libai.inference behaviour the other tests left open: beam search on a
batch whose rows finish at different steps (the per-row "done" heuristic of transformers'
``generate``), zero new tokens, beam search and the static cache creating every tensor on
the prompt's device (run under a ``meta`` default device), the mT5 layer count, a libai
checkpoint loaded for inference leaving the RNG states alone, interpolations of
``model.cfg`` resolved for a Hugging Face model, the CPU default compile mode, and a stage
header built on the pipe's device. Each is compared with transformers on the same weights,
plain torch, or a hand-derived value."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import transformers
from generation_helpers import load_tiny_gpt2
from generation_helpers import random_prompts as prompts
from launch import torchrun

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.inference.basic import BasePipeline, num_layers_from_hf_config
from libai.inference.generation import ModelStepper, generate
from libai.inference.text_generation import TextGenerationPipeline
from libai.models.utils import load_huggingface

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The tiny GPT-2 directory, its transformers model and a stepper on the same weights."""
    dist.setup_dist_util()
    yield load_tiny_gpt2(tmp_path_factory.mktemp("beam"))
    dist.reset_dist_util()


def produced_tokens(hf, ids) -> list[int]:
    """Tokens greedy decoding produces a few steps in: as eos, rows and beams end early."""
    first = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    return sorted({int(first[0, 6]), int(first[1, 6]), int(first[0, 5]), int(first[1, 7])})


def hf_beam(hf, ids, eos: int, **settings) -> torch.Tensor:
    hf.generation_config.eos_token_id = eos
    return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **settings)


# ---- beam search: rows that are done at different steps -------------------------------------
BEAM_SETTINGS = [
    dict(num_beams=2, length_penalty=2.0, early_stopping=False),
    dict(num_beams=2, length_penalty=3.0, early_stopping=False),
    dict(num_beams=3, length_penalty=1.0, early_stopping=False),
    dict(num_beams=2, length_penalty=0.5, early_stopping=False),
    dict(num_beams=3, length_penalty=1.5, early_stopping=True),
    dict(num_beams=3, length_penalty=2.0, early_stopping="never"),
]


@pytest.mark.parametrize("seed", [1, 4])
def test_beam_rows_done_at_different_steps_equal_transformers(gpt2, seed):
    """Two prompts, eos a token the model does produce: one row's beams can satisfy the
    "no running beam can beat the worst finished one" heuristic long before the other's.
    A done row takes no more hypotheses and the search stops when every row is done, as in
    transformers' ``generate`` (same tokens, same length) for length penalties around 1 and
    every ``early_stopping`` mode."""
    ids = prompts(gpt2.hf.config.vocab_size, seed)
    for eos in produced_tokens(gpt2.hf, ids):
        for settings in BEAM_SETTINGS:
            want = hf_beam(gpt2.hf, ids, eos, max_new_tokens=10, **settings)
            got = generate(
                gpt2.stepper,
                ids,
                torch.ones_like(ids),
                max_new_tokens=10,
                eos_token_id=eos,
                **settings,
            )
            assert got.shape == want.shape and torch.equal(got, want), (eos, settings, got, want)


def test_beam_with_zero_new_tokens_returns_the_prompt(gpt2):
    """``max_new_tokens=0`` (allowed by the config) adds nothing: each of the
    ``num_return_sequences`` rows of a prompt is the prompt itself (hand-derived;
    transformers refuses 0)."""
    ids = prompts(gpt2.hf.config.vocab_size, 0)
    got = generate(
        gpt2.stepper,
        ids,
        torch.ones_like(ids),
        max_new_tokens=0,
        num_beams=3,
        num_return_sequences=2,
        eos_token_id=gpt2.hf.config.eos_token_id,
    )
    assert torch.equal(got, ids.repeat_interleave(2, dim=0))


# ---- every tensor on the prompt's device ------------------------------------------------------
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_beam_search_makes_its_tensors_on_the_prompt_device(gpt2, cache):
    """Under ``torch.device("meta")`` a factory call without ``device=`` makes a meta tensor;
    the model and the prompt stay on the CPU. Beam search (and the static cache's slot mask)
    must create their state on the prompt's device: the tokens then equal transformers'
    beam search outside the context."""
    ids = prompts(gpt2.hf.config.vocab_size, 0)
    eos = produced_tokens(gpt2.hf, ids)[0]
    settings = dict(max_new_tokens=6, num_beams=3, length_penalty=1.5)
    want = hf_beam(gpt2.hf, ids, eos, **settings)
    with torch.device("meta"):
        got = generate(
            gpt2.stepper,
            ids,
            torch.ones_like(ids),
            eos_token_id=eos,
            cache_implementation=cache,
            **settings,
        )
    assert got.device.type == "cpu" and torch.equal(got, want), (got, want)


# ---- the stepper's compile mode ------------------------------------------------------------------
def test_cpu_stepper_compiles_with_the_default_mode(gpt2, monkeypatch):
    """The documented default: ``"reduce-overhead"`` (CUDA graphs) on CUDA only, the default
    Inductor mode elsewhere. ``torch.compile`` is replaced by a recorder that returns the
    function itself (no compilation): the compiled generation asks for mode "default" on the
    CPU and its tokens equal transformers' greedy decoding."""
    modes = []

    def record(fn, mode=None, **kwargs):
        modes.append(mode)
        return fn

    monkeypatch.setattr(torch, "compile", record)
    stepper = ModelStepper(gpt2.stepper.model)
    assert stepper.compile_mode == "default"
    ids = prompts(gpt2.hf.config.vocab_size, 2)
    gpt2.hf.generation_config.eos_token_id = None  # no early end: 5 tokens
    want = gpt2.hf.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=5
    )
    got = generate(
        stepper, ids, torch.ones_like(ids), max_new_tokens=5, eos_token_id=None, compile=True
    )
    assert torch.equal(got, want) and modes == ["default"]


# ---- layer counts -------------------------------------------------------------------------------
def test_mt5_layer_count_is_encoder_plus_decoder():
    """mT5 configs count encoder + decoder layers, like T5 (transformers' MT5Config)."""
    config = transformers.MT5Config(num_layers=3, num_decoder_layers=2).to_dict()
    assert config["model_type"] == "mt5"
    assert num_layers_from_hf_config(config) == 3 + 2
    same = transformers.MT5Config(num_layers=4).to_dict()  # decoder defaults to the encoder's
    assert num_layers_from_hf_config(same) == 4 + same["num_decoder_layers"] == 8


# ---- libai checkpoints: the weights only ------------------------------------------------------
def test_load_checkpoint_loads_weights_and_leaves_rng_alone(gpt2, tmp_path):
    """Loading a trainer checkpoint for inference restores the weights but not the saved
    RNG states (a resume would): after the load, torch / numpy / random continue from the
    seeds set just before it (references drawn from freshly seeded generators)."""
    model = load_huggingface(gpt2.path).eval()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    Checkpointer(model, str(tmp_path / "output")).save("model_final")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    BasePipeline.load_checkpoint(model, str(tmp_path / "output"))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    want_torch = torch.rand(4, generator=torch.Generator().manual_seed(123))
    assert torch.equal(torch.rand(4), want_torch)
    assert np.random.rand() == np.random.RandomState(123).rand()
    assert random.random() == random.Random(123).random()


# ---- Hugging Face models with a config file: interpolations resolved --------------------------
CONFIG = """
from libai.config import LazyCall
from libai.models import GPTForPreTraining

model = LazyCall(GPTForPreTraining)(
    cfg=dict(
        use_scaled_init_for_output_weights=False,
        apply_residual_post_layernorm="${.use_scaled_init_for_output_weights}",
    )
)
"""


def test_huggingface_model_cfg_interpolations_are_resolved(gpt2, tmp_path):
    """``model.cfg.apply_residual_post_layernorm`` is an interpolation of a False key: the
    model is built with False (the GPT-2 block), so its logits equal transformers' on the
    same weights. Left unresolved, the string "${...}" would count as True."""

    config = tmp_path / "gpt2_interp.py"
    config.write_text(CONFIG)
    pipe = TextGenerationPipeline(str(config), model_path=gpt2.path, mode="huggingface")
    ids = prompts(gpt2.hf.config.vocab_size, 3)
    with torch.no_grad():
        ours = pipe.model(ids)["logits"]
        theirs = gpt2.hf(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


# ---- stage messages: the header on the pipe's device ----------------------------------------
def test_stage_send_builds_its_header_on_the_pipe_device():
    """Two gloo ranks under torchrun (pp2): stage 0 sends a tuple while the default device is
    ``meta``, stage 1 receives it. The header must be made on the pipe's device (the CPU),
    so the tuple arrives as sent (dtypes, shapes, values, the None)."""
    results = torchrun("stage_comm_device.py", 2)
    assert all(r["ok"] for r in results), results
    assert results[0]["stage"] == 0 and results[1]["stage"] == 1
    assert results[1]["received"] == results[0]["sent"]
