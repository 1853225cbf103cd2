"""Sampling inside ``generate`` equals transformers' processors, step by step.

For GPT-2 and Llama (tiny random weights), a seeded sampling run records, at every step,
the sequences so far, the scores the model gave and the scores it sampled from. The
reference is transformers' own ``LogitsProcessorList`` (repetition penalty, no-repeat
n-gram, min new tokens, temperature, top-k, top-p, in transformers' order) applied to the
same ids and scores: equal to fp32 rounding, and each sampled token is the one
``torch.multinomial`` draws from the reference distribution with the row's seeded
generator. Leaving any one processor out of the reference changes the result, so a
processor dropped (or a setting ignored) inside ``generate`` turns this test red.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from generation_helpers import make_generation_dirs
from transformers.generation import logits_process as hf

from libai import dist
from libai.inference.generation import ModelStepper, generate
from libai.inference.generation import search as search_module
from libai.inference.generation.generate import row_generators
from libai.models.utils import load_huggingface

COMMON = dict(do_sample=True, seed=11, max_new_tokens=10, repetition_penalty=1.4)
SETTINGS = {
    # the warpers narrow the distribution (with a penalty before them)
    "warpers": dict(COMMON, temperature=0.6, top_k=40, top_p=0.9),
    # no warper (top_k=0: the default is 50, as in transformers): every penalty and
    # constraint shows in the full distribution
    "constraints": dict(COMMON, top_k=0, no_repeat_ngram_size=2, min_new_tokens=6),
}
#: processor name -> the settings that switch it on
USES = {
    "repetition_penalty": "warpers",
    "temperature": "warpers",
    "top_k": "warpers",
    "top_p": "warpers",
    "no_repeat_ngram": "constraints",
    "min_new_tokens": "constraints",
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    dist.setup_dist_util()
    return make_generation_dirs(tmp_path_factory.mktemp("sampling"))


def reference_processors(settings: dict, prompt_len: int, eos: int, leave_out: str = ""):
    """transformers' processors for ``settings``, in its order, optionally without one."""
    s = settings
    named = []
    if s.get("repetition_penalty", 1.0) != 1.0:
        named.append(
            ("repetition_penalty", hf.RepetitionPenaltyLogitsProcessor(s["repetition_penalty"]))
        )
    if s.get("no_repeat_ngram_size", 0):
        named.append(
            ("no_repeat_ngram", hf.NoRepeatNGramLogitsProcessor(s["no_repeat_ngram_size"]))
        )
    if s.get("min_new_tokens", 0):
        named.append(
            (
                "min_new_tokens",
                hf.MinNewTokensLengthLogitsProcessor(prompt_len, s["min_new_tokens"], [eos]),
            )
        )
    if s.get("temperature", 1.0) != 1.0:
        named.append(("temperature", hf.TemperatureLogitsWarper(s["temperature"])))
    if s.get("top_k", 0):
        named.append(("top_k", hf.TopKLogitsWarper(s["top_k"])))
    if s.get("top_p", 1.0) < 1.0:
        named.append(("top_p", hf.TopPLogitsWarper(s["top_p"])))
    assert leave_out in ("", *(name for name, _ in named)), leave_out
    return hf.LogitsProcessorList([p for name, p in named if name != leave_out])


def record_sampling(path: str, settings: dict, monkeypatch):
    """Run seeded sampling; returns ``(prompt ids, mask, steps, sequences, eos)``, each step
    ``(ids so far, model scores, processed scores)``. The prompts end with their first
    token, so the no-repeat n-gram rule bans a token from the first step on."""
    config = transformers.AutoConfig.from_pretrained(path)
    vocab, eos = config.vocab_size, config.eos_token_id
    ids = torch.randint(3, vocab, (3, 6), generator=torch.Generator().manual_seed(5))
    ids[:, -1] = ids[:, 0]
    mask = torch.ones_like(ids)
    steps = []
    real = search_module.apply_processors

    def recording(processors, sequences, scores):
        out = real(processors, sequences, scores)
        steps.append((sequences.clone(), scores.clone(), out.clone()))
        return out

    monkeypatch.setattr(search_module, "apply_processors", recording)
    stepper = ModelStepper(load_huggingface(path).eval())
    sequences = generate(stepper, ids, mask, eos_token_id=eos, **settings)
    return ids, mask, steps, sequences, eos


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_sampling_equals_transformers_processors_and_draws(dirs, kind, name, monkeypatch):
    settings = SETTINGS[name]
    ids, mask, steps, sequences, eos = record_sampling(dirs[kind], settings, monkeypatch)
    assert len(steps) == settings["max_new_tokens"]
    prompt_len = ids.shape[1]
    reference = reference_processors(settings, prompt_len, eos)
    generators = row_generators(settings["seed"], ids, mask, 1)
    for t, (seen, scores, ours) in enumerate(steps):
        want = reference(seen, scores.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(want)), (kind, t)
        finite = torch.isfinite(want)
        assert (ours[finite] - want[finite]).abs().max() <= 1e-6, (kind, t)
        probs = want.softmax(dim=-1)
        drawn = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
        unfinished = ~(seen[:, prompt_len:] == eos).any(dim=1)
        assert torch.equal(sequences[unfinished, prompt_len + t], drawn[unfinished]), (kind, t)


@pytest.mark.parametrize("left_out", sorted(USES))
def test_every_processor_changes_the_reference(dirs, left_out, monkeypatch):
    """The reference without one processor differs from the run at some step: each one is
    in effect in the recorded run, so dropping it inside ``generate`` cannot pass."""
    settings = SETTINGS[USES[left_out]]
    ids, _, steps, _, eos = record_sampling(dirs["gpt2"], settings, monkeypatch)
    without = reference_processors(settings, ids.shape[1], eos, leave_out=left_out)
    differs = [
        not torch.equal(without(seen, scores.clone()).isinf(), ours.isinf())
        or not torch.allclose(
            without(seen, scores.clone()).nan_to_num(neginf=0.0),
            ours.nan_to_num(neginf=0.0),
            atol=1e-5,
        )
        for seen, scores, ours in steps
    ]
    assert any(differs), left_out
