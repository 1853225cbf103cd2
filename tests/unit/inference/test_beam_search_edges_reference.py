"""Beam search where the other generation tests do not reach, against transformers'
``generate`` on the same tiny GPT-2 (or a hand-derived value): stop strings (transformers'
``StopStringCriteria`` marks each candidate, as eos does), more candidates ending at one step
than there are beams, several eos tokens, the padding of hypotheses that ended early, a full
list of finished hypotheses without early stopping, ``early_stopping="never"`` with length
penalties up to 1, left-padded prompts under a repetition penalty, and a stop string that
starts in the prompt."""

from __future__ import annotations

import pytest
import torch
import transformers
from generation_helpers import load_tiny_gpt2
from generation_helpers import random_prompts as prompts

from libai import dist
from libai.inference.generation import generate

transformers.logging.set_verbosity_error()

PAD = 1


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The tiny GPT-2 directory, its transformers model and tokenizer, and a stepper."""
    dist.setup_dist_util()
    yield load_tiny_gpt2(tmp_path_factory.mktemp("beam_edges"))
    dist.reset_dist_util()


class PlaceTokens:
    """A logits processor (transformers' and ours share the ``(ids, scores)`` call): at the
    generated steps ``steps``, in the beams ``beams`` of each input (all when None), token
    ``tokens[i]`` gets the row's best score + ``offset`` - 0.01 * i: with a positive offset
    the tokens become the beam's best candidates in that order, with a small negative one
    they come right after its best token. ``absolute``: 0 + ``offset`` - 0.01 * i instead
    (0 is a log-probability of 1: a beam that takes the token loses no score). ``rest`` is
    added to the other tokens' scores in those beams first."""

    def __init__(
        self, prompt_len, num_beams, steps, tokens, offset, beams=None, absolute=False, rest=0.0
    ):
        self.prompt_len, self.num_beams, self.steps = prompt_len, num_beams, steps
        self.tokens, self.offset, self.beams, self.absolute = tokens, offset, beams, absolute
        self.rest = rest

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] - self.prompt_len not in self.steps:
            return scores
        scores = scores.clone()
        best = torch.zeros(len(scores)) if self.absolute else scores.max(-1).values
        for row in range(len(scores)):
            if self.beams is None or row % self.num_beams in self.beams:
                scores[row] += self.rest
                for i, token in enumerate(self.tokens):
                    scores[row, token] = best[row] + self.offset - 0.01 * i
        return scores


def both(gpt2, ids, processors=(), *, eos=None, pad=PAD, **settings):
    """(transformers' beam search, ours) on the same prompts and settings, and how many
    hypotheses transformers padded. Without an eos transformers pads the hypotheses that ended
    early with -1 whatever the pad token; ours pads with ``pad_token_id`` when there is one:
    transformers' -1 are then replaced by it."""
    mask = torch.ones_like(ids)
    gpt2.hf.generation_config.eos_token_id = eos
    want = gpt2.hf.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        tokenizer=gpt2.tok,
        pad_token_id=pad,
        logits_processor=transformers.LogitsProcessorList(processors),
        **settings,
    )
    got = generate(
        gpt2.stepper,
        ids,
        mask,
        tokenizer=gpt2.tok,
        eos_token_id=eos,
        pad_token_id=pad,
        extra_processors=list(processors),
        **settings,
    )
    ended = int((want == -1).any(1).sum())
    if eos is None and pad is not None:
        want = want.masked_fill(want == -1, pad)
    return want, got, ended


def assert_same(want, got, *context):
    assert got.shape == want.shape and torch.equal(got, want), (*context, got, want)


def beam_tokens(gpt2, ids, num_beams: int, max_new_tokens: int = 8) -> torch.Tensor:
    """The generated tokens of transformers' unconstrained beams (all returned)."""
    free = gpt2.hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        eos_token_id=None,
        pad_token_id=PAD,
        max_new_tokens=max_new_tokens,
        num_beams=num_beams,
        num_return_sequences=num_beams,
    )
    return free[:, ids.shape[1] :]


def stop_letters(gpt2, ids, num_beams: int) -> list[str]:
    """Letters the unconstrained beams generate: stop strings beams do reach."""
    text = "".join(gpt2.tok.decode(row) for row in beam_tokens(gpt2, ids, num_beams))
    return sorted({ch for ch in text if ch.isalpha()})


# ---- stop strings ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [
        dict(num_beams=2, num_return_sequences=2, length_penalty=1.0),
        dict(num_beams=3, num_return_sequences=2, length_penalty=2.0, early_stopping=True),
        dict(num_beams=3, num_return_sequences=3, length_penalty=0.5, early_stopping="never"),
    ],
)
def test_beam_stop_strings_end_hypotheses_as_transformers(gpt2, settings):
    """Each letter the beams generate, as a stop string: the returned hypotheses (tokens,
    order and length) equal transformers' for every ``early_stopping`` mode."""
    ids = prompts(gpt2.hf.config.vocab_size, 1)
    letters = stop_letters(gpt2, ids, settings["num_beams"])
    assert len(letters) >= 2, letters
    ended_early = 0
    for stop in letters:
        want, got, ended = both(gpt2, ids, stop_strings=[stop], max_new_tokens=8, **settings)
        assert_same(want, got, stop)
        ended_early += ended
    assert ended_early, "no returned hypothesis ended before max_new_tokens"


def test_without_eos_or_pad_ended_hypotheses_end_in_minus_one(gpt2):
    """No eos and no pad token: hypotheses a stop string ended are padded with -1, as
    transformers pads them."""
    ids = prompts(gpt2.hf.config.vocab_size, 1)
    stop = stop_letters(gpt2, ids, 2)[0]
    settings = dict(num_beams=2, num_return_sequences=2, max_new_tokens=8, stop_strings=[stop])
    want, got, ended = both(gpt2, ids, pad=None, **settings)
    assert ended, "no returned hypothesis ended before max_new_tokens"
    assert_same(want, got, stop)


def test_stop_string_starting_in_the_prompt_does_not_end_a_beam(gpt2):
    """A stop string made of the prompt's last character and the text of a token the beams
    generate first is only ever complete across the prompt's end: the generated text never
    holds it, so the beams are those of the search without stop strings (hand-derived;
    transformers also matches across the prompt's end)."""
    ids = prompts(gpt2.hf.config.vocab_size, 1)[:1]
    settings = dict(num_beams=3, num_return_sequences=3, max_new_tokens=6)
    free = beam_tokens(gpt2, ids, 3, 6)
    tail = gpt2.tok.decode(ids[0])[-1]
    stops = [tail + gpt2.tok.decode(row[:1]) for row in free]
    assert all(stop not in gpt2.tok.decode(row) for row in free for stop in stops)
    _, got, _ = both(gpt2, ids, stop_strings=stops, **settings)
    want = torch.cat((ids.expand(3, -1), free), 1)
    assert_same(want, got, stops)


# ---- more candidates end than there are beams -------------------------------------------------
@pytest.mark.parametrize("num_beams", [2, 3])
@pytest.mark.parametrize("first_is_eos", [False, True])
def test_more_candidates_end_than_beams_as_transformers(gpt2, num_beams, first_is_eos):
    """At step 2 the first beam of each input gives ``num_beams + 1`` letters, each a stop
    string (or the first one the eos), a log-probability of 1: of the ``2 * num_beams`` kept
    candidates more end than can finish, and fewer than ``num_beams`` go on, so a running
    beam is one that ended (scored "impossible") while the search goes on
    (``early_stopping="never"``, length penalty 3). The hypotheses, their order and the
    search's length equal transformers'."""
    ids = prompts(gpt2.hf.config.vocab_size, 1)
    letters = list("abcd"[: num_beams + 1])
    tokens = gpt2.tok.convert_tokens_to_ids(letters)
    place = PlaceTokens(ids.shape[1], num_beams, {2}, tokens, 0.0, beams={0}, absolute=True)
    settings = dict(num_beams=num_beams, num_return_sequences=num_beams, length_penalty=3.0)
    settings.update(early_stopping="never", max_new_tokens=7)
    eos, stops = (tokens[0], letters[1:]) if first_is_eos else (None, letters)
    want, got, _ = both(gpt2, ids, [place], eos=eos, stop_strings=stops, **settings)
    assert_same(want, got)


# ---- eos ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_beams", [2, 3])
def test_several_eos_tokens_as_transformers(gpt2, num_beams):
    """Two eos tokens, each a log-probability of 1 in every beam at step 2 (the other tokens 5
    lower): the ``2 * num_beams`` best candidates all end, and only the ``3 * num_beams`` kept
    hold ``num_beams`` that go on (``early_stopping="never"``, length penalty 3: the search
    goes on). Same hypotheses as transformers."""
    ids = prompts(gpt2.hf.config.vocab_size, 4)
    eos = [int(t) for t in beam_tokens(gpt2, ids, num_beams)[:, 4].unique()[:2]]
    assert len(eos) == 2
    place = PlaceTokens(ids.shape[1], num_beams, {2}, eos, 0.0, absolute=True, rest=-5.0)
    settings = dict(num_beams=num_beams, num_return_sequences=num_beams, length_penalty=3.0)
    settings.update(early_stopping="never", max_new_tokens=7)
    want, got, _ = both(gpt2, ids, [place], eos=eos, **settings)
    assert want.shape[1] > ids.shape[1] + 3, "the search ended at step 2"
    assert_same(want, got, eos)


@pytest.mark.parametrize("pad", [0, 2])
def test_beam_pads_ended_hypotheses_as_transformers(gpt2, pad):
    """With an eos, hypotheses that ended early are padded with a non-zero ``pad_token_id``
    and with eos when it is 0 (T5's), the tokens of transformers' beam search."""
    ids = prompts(gpt2.hf.config.vocab_size, 1)
    settings = dict(max_new_tokens=10, num_beams=3, num_return_sequences=3, early_stopping=False)
    eos = int(beam_tokens(gpt2, ids, 3, 10)[0, 3])  # a token a beam produces: hypotheses end
    want, got, _ = both(gpt2, ids, eos=eos, pad=pad, **settings)
    new = want[:, ids.shape[1] :]
    after_eos = (new == eos).int().cumsum(1) - (new == eos).int() > 0
    assert after_eos.any(), "no hypothesis ended early"
    assert set(new[after_eos].tolist()) == {pad or eos}
    assert_same(want, got, eos, pad)


def test_full_finished_list_does_not_end_the_search_without_early_stopping(gpt2):
    """eos is every beam's best candidate at steps 1 and 2: each input has ``num_beams``
    finished hypotheses by step 2. With ``early_stopping=False`` the search goes on while a
    running beam may still beat the worst of them (length penalty 3), and the longer
    hypotheses it finds replace them, as in transformers."""
    ids = prompts(gpt2.hf.config.vocab_size, 4)
    eos = int(beam_tokens(gpt2, ids, 2)[0, 5])
    place = PlaceTokens(ids.shape[1], 2, {1, 2}, [eos], 0.1)
    settings = dict(num_beams=2, num_return_sequences=2, length_penalty=3.0, early_stopping=False)
    want, got, _ = both(gpt2, ids, [place], eos=eos, max_new_tokens=7, **settings)
    assert want.shape[1] > ids.shape[1] + 3, "the search ended with the first finished list"
    assert_same(want, got, eos)


@pytest.mark.parametrize("length_penalty", [0.5, 1.0])
def test_never_stopping_with_length_penalty_up_to_one(gpt2, length_penalty):
    """``early_stopping="never"`` with a positive length penalty up to 1: the heuristic scores
    the best running beam at the maximum length, as transformers does. eos is every beam's
    best candidate at steps 1 and 2 (a full list of short hypotheses); from step 3 on a token
    costs the running beams nothing, so they end up beating those hypotheses."""
    ids = prompts(gpt2.hf.config.vocab_size, 4)
    eos, free = (int(t) for t in beam_tokens(gpt2, ids, 2)[0, 5:7])
    early = PlaceTokens(ids.shape[1], 2, {1, 2}, [eos], 0.1)
    late = PlaceTokens(ids.shape[1], 2, {3, 4, 5, 6}, [free], 0.0, absolute=True)
    settings = dict(num_beams=2, length_penalty=length_penalty, early_stopping="never")
    want, got, _ = both(gpt2, ids, [early, late], eos=eos, max_new_tokens=7, **settings)
    assert want.shape[1] == ids.shape[1] + 7, "no hypothesis of the full length won"
    assert_same(want, got, eos)


# ---- left padding ------------------------------------------------------------------------------
def test_left_padding_is_not_penalized_in_beam_search(gpt2):
    """The repetition penalty skips a row's left padding in beam search too: the padded row of
    a batch decodes as the same prompt alone, unpadded, in transformers. The pad id is the
    token that search picks first, so a penalty on the padding would change it."""
    ids = prompts(gpt2.hf.config.vocab_size, 3)
    alone = ids[1:2, 2:]
    settings = dict(num_beams=2, max_new_tokens=5, repetition_penalty=50.0)
    want, _, _ = both(gpt2, alone, **settings)
    pad = int(want[0, alone.shape[1]])
    assert pad not in alone[0].tolist()  # penalized only if the padding counts
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    padded = ids.masked_fill(mask == 0, pad)
    got = generate(gpt2.stepper, padded, mask, eos_token_id=None, **settings)
    assert torch.equal(got[1:, 2:], want), (got, want)
