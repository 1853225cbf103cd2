"""Greedy decoding (``sample_search``) in the cases the other generation tests leave open:
every tensor made on the prompt's device (run under a ``meta`` default device, as a GPU run
would put a device-less tensor on the CPU), left padding kept out of the repetition penalty,
and stop strings matched in the generated text only. Each is compared with transformers on
the same tiny GPT-2 or with a hand-derived case."""

from __future__ import annotations

import pytest
import torch
import transformers
from generation_helpers import load_tiny_gpt2

from libai import dist
from libai.inference.generation import generate

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The tiny GPT-2 directory, its transformers model and tokenizer, and a stepper."""
    dist.setup_dist_util()
    yield load_tiny_gpt2(tmp_path_factory.mktemp("greedy"))
    dist.reset_dist_util()


def left_padded(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (3, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def hf_greedy(gpt2, ids, mask, **settings) -> torch.Tensor:
    return gpt2.hf.generate(ids, attention_mask=mask, do_sample=False, **settings)


def test_greedy_makes_its_tensors_on_the_prompt_device(gpt2):
    """Under ``torch.device("meta")`` a factory call without ``device=`` makes a meta tensor
    while the model and the left-padded prompts stay on the CPU: greedy decoding with an eos
    the model produces (rows finish apart) and a stop string must still equal transformers'
    greedy decoding outside the context (the stop string ends decoding at the first
    token whose text completes it, found by decoding prefix after prefix)."""
    ids, mask = left_padded(gpt2.hf.config.vocab_size)
    first = hf_greedy(gpt2, ids, mask, max_new_tokens=8, eos_token_id=None)
    eos = int(first[0, ids.shape[1] + 2])  # a token row 0 produces: it finishes early
    gpt2.hf.generation_config.eos_token_id = eos
    want = hf_greedy(gpt2, ids, mask, max_new_tokens=8, pad_token_id=eos)
    with torch.device("meta"):
        got = generate(gpt2.stepper, ids, mask, max_new_tokens=8, eos_token_id=eos)
        stopped = generate(
            gpt2.stepper,
            ids[:1],
            mask[:1],
            max_new_tokens=8,
            eos_token_id=None,
            stop_strings=[gpt2.tok.decode(first[0, ids.shape[1] + 3])],  # ends by token 4
            tokenizer=gpt2.tok,
        )
    assert got.device.type == "cpu" and torch.equal(got, want), (got, want)
    new = first[0, ids.shape[1] :].tolist()
    stop = gpt2.tok.decode(new[3])
    end = next(j for j in range(len(new)) if stop in gpt2.tok.decode(new[: j + 1]))
    assert torch.equal(stopped, first[:1, : ids.shape[1] + end + 1]), (stopped, first)


def test_left_padding_is_not_penalized_as_a_repeated_token(gpt2):
    """The repetition penalty skips a row's left padding: the padded row of a batch decodes
    exactly as the same prompt alone, unpadded (transformers on that prompt is the
    reference). The pad id is the token the unpadded prompt's first step picks, so a
    penalty on the padding would change that row's first token."""
    ids, mask = left_padded(gpt2.hf.config.vocab_size)
    alone = ids[1:2, 3:]
    settings = dict(max_new_tokens=6, repetition_penalty=50.0)
    want = hf_greedy(gpt2, alone, torch.ones_like(alone), eos_token_id=None, **settings)
    pad = int(want[0, alone.shape[1]])
    assert pad not in alone[0].tolist()  # penalized only if the padding counts
    padded = ids.masked_fill(mask == 0, pad)
    got = generate(gpt2.stepper, padded, mask, eos_token_id=None, **settings)
    assert torch.equal(got[1, 3:], want[0]), (got, want)


def test_stop_strings_look_at_the_generated_text_only(gpt2):
    """A stop string that spans the end of the prompt and the first generated token is not
    in the generated text: decoding goes on to ``max_new_tokens`` (hand-derived: the stop
    string ends in the first token but starts in the prompt)."""
    ids = torch.randint(
        3, gpt2.hf.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2)
    )
    full = hf_greedy(gpt2, ids, torch.ones_like(ids), max_new_tokens=6, eos_token_id=None)
    new = full[0, ids.shape[1] :].tolist()
    text_of_new = gpt2.tok.decode(new)
    stop = gpt2.tok.decode(ids[0])[-1] + gpt2.tok.decode(new[:1])
    assert stop not in text_of_new  # only across the boundary
    got = generate(
        gpt2.stepper,
        ids,
        torch.ones_like(ids),
        max_new_tokens=6,
        eos_token_id=None,
        stop_strings=[stop],
        tokenizer=gpt2.tok,
    )
    assert torch.equal(got, full), (got, full)


class ForceTokens:
    """A logits processor (transformers' and ours share the ``(ids, scores)`` call) that
    makes step ``k`` after the prompt pick ``tokens[k]``."""

    def __init__(self, prompt_len: int, tokens: list[int]):
        self.prompt_len, self.tokens = prompt_len, tokens

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(scores, -1e9)
        forced[:, self.tokens[ids.shape[1] - self.prompt_len]] = 0.0
        return forced


@pytest.mark.parametrize(
    "stop",
    [
        "é",  # completed by its second byte token: the text before ends in U+FFFD
        "aé",  # from the first token through the second byte of "é"
        "a",  # the whole text of the first generated token
        "cc",  # after "é", ending one token later
        "q",  # never generated: decoding runs to max_new_tokens
    ],
)
def test_stop_strings_end_where_transformers_ends(gpt2, stop):
    """Forced tokens ``a``, the two byte tokens of ``é``, then ``c``s: greedy decoding with
    a stop string ends at the same token as transformers' ``StopStringCriteria`` on the same
    tokenizer (a stop string completed by the last byte of a character included)."""
    e_bytes = gpt2.tok.encode("é")
    a, c = gpt2.tok.convert_tokens_to_ids(["a", "c"])
    assert len(e_bytes) == 2 and gpt2.tok.decode(e_bytes[:1]) == "\ufffd"
    prompt = torch.tensor([[c, a]])
    mask = torch.ones_like(prompt)
    forced = ForceTokens(prompt.shape[1], [a, *e_bytes, c, c, c])
    settings = dict(max_new_tokens=6, eos_token_id=None, stop_strings=[stop])
    want = gpt2.hf.generate(
        prompt,
        attention_mask=mask,
        do_sample=False,
        tokenizer=gpt2.tok,
        logits_processor=transformers.LogitsProcessorList([forced]),
        pad_token_id=c,
        **settings,
    )
    got = generate(
        gpt2.stepper, prompt, mask, tokenizer=gpt2.tok, extra_processors=[forced], **settings
    )
    assert torch.equal(got, want), (stop, got, want)
