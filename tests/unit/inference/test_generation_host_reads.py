"""The greedy / sampling loop (``sample_search``). Device reads: with nothing that can end a
row early (no eos, no stop strings) greedy decoding reads nothing back per token, so on a
GPU the host queues the next step while the device runs this one; with an eos token it reads
once per token (to stop when every row is done), as transformers does. Counted through
``Tensor.__bool__`` / ``item`` / ``tolist`` (every device-to-host read of the loop goes
through one of them). Also: stop strings end rows without an eos token, and unseeded
sampling draws from the global RNG as transformers does."""

from __future__ import annotations

import pytest
import torch
import transformers

from libai import dist
from libai.inference.generation import ModelStepper, generate
from libai.models.utils import load_huggingface


@pytest.fixture(scope="module")
def stepper(tmp_path_factory):
    dist.setup_dist_util()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    path = tmp_path_factory.mktemp("gpt2")
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return ModelStepper(load_huggingface(str(path)).eval())


def reads_during(fn, monkeypatch) -> int:
    count = 0
    for name in ("__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            nonlocal count
            count += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    try:
        fn()
    finally:
        monkeypatch.undo()
    return count


def test_without_eos_the_reads_do_not_grow_with_the_tokens(stepper, monkeypatch):
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def run(n, **settings):
        return lambda: generate(stepper, ids, mask, max_new_tokens=n, pad_token_id=0, **settings)

    out = run(12, eos_token_id=None)()
    # an eos id the generation never produces: the checking loop gives the same tokens
    eos = min(set(range(1, 64)) - set(out[:, 5:].flatten().tolist()))
    assert torch.equal(run(12, eos_token_id=eos)(), out)
    short = reads_during(run(4, eos_token_id=None), monkeypatch)
    long = reads_during(run(12, eos_token_id=None), monkeypatch)
    assert short == long
    # with an eos token: one read per token more (the "all rows done?" check)
    eos_short = reads_during(run(4, eos_token_id=eos), monkeypatch)
    eos_long = reads_during(run(12, eos_token_id=eos), monkeypatch)
    assert eos_long - eos_short == 8


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from generation_helpers import make_gpt2_dir

    return make_gpt2_dir(tmp_path_factory.mktemp("gpt2_tok"))


def test_stop_strings_alone_end_the_generation(gpt2_dir):
    """No eos token, a stop string: the rows still finish (the loop checks because a stop
    string can end them), padded after the stop."""
    dist.setup_dist_util()
    tok = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    stepper = ModelStepper(load_huggingface(gpt2_dir).eval())
    enc = tok(["the quick brown fox"], return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    settings = dict(max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    full = generate(stepper, ids, mask, **settings)
    text = tok.decode(full[0, ids.shape[1] :])
    stop = text[3:5]
    cut = generate(stepper, ids, mask, stop_strings=stop, tokenizer=tok, **settings)
    assert cut.shape[1] < full.shape[1]
    assert stop in tok.decode(cut[0, ids.shape[1] :])


def test_unseeded_sampling_draws_as_transformers_does(tmp_path):
    """``do_sample`` without ``seed`` draws from the global RNG, one
    ``multinomial(probs, 1)`` per step, as transformers does: the same global seed gives
    transformers' tokens."""
    dist.setup_dist_util()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    stepper = ModelStepper(load_huggingface(str(tmp_path)).eval())
    ids = torch.randint(1, 64, (3, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    settings = dict(do_sample=True, max_new_tokens=10, top_k=20, temperature=0.9)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    for seed in (0, 1):
        torch.manual_seed(seed)
        ours = generate(stepper, ids, mask, eos_token_id=None, pad_token_id=0, **settings)
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = hf.generate(ids, attention_mask=mask, **settings)
        assert torch.equal(ours, theirs), seed
