"""Device reads in the decoding loop: with nothing that can end a row early (no eos, no stop
strings) greedy decoding reads nothing back per token, so on a GPU the host queues the next
step while the device runs this one; with an eos token it reads once per token (to stop
when every row is done), as transformers does. Counted through ``Tensor.__bool__`` /
``item`` / ``tolist`` (every device-to-host read of the loop goes through one of them)."""

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
