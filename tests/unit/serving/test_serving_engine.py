"""The serving engine on one process against independent references:

- greedy tokens under continuous batching (requests of mixed lengths arriving at different
  steps, prompts prefilled in chunks beside decoding sequences) equal transformers'
  ``generate`` on the same weights and libai's own per-request ``generate``, request by
  request (Llama and GPT-2);
- preemption (a cache too small for the load) keeps the tokens identical;
- every block is free again afterwards and no sequence ever holds more than
  ceil(len / block) + 1 blocks;
- seeded sampling draws the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from serving_models import VOCAB, hf_greedy, tiny_hf

from libai import dist
from libai.inference.generation import ModelStepper, generate
from libai.layers.paged_kv_cache import PagedKVCache
from libai.models.utils import load_huggingface
from libai.serving import EngineConfig, LLMEngine, ModelExecutor, SamplingParams


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def models(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = tiny_hf(request.param, directory)
    dist.setup_dist_util({})
    return hf, load_huggingface(str(directory)).eval()


def make_engine(model, **sizes) -> LLMEngine:
    config = EngineConfig(**{"max_model_len": 96, "block_size": 4, **sizes})
    cache = PagedKVCache(config.blocks(), config.block_size)
    return LLMEngine(ModelExecutor(model, cache, "cpu"), config=config)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (count,), generator=g).tolist()
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def run(engine: LLMEngine, requests, arrivals, watch=None) -> dict:
    """Feed request ``i`` at step ``arrivals[i]``; step until all finish; each's sequence."""
    pending = sorted(range(len(requests)), key=lambda i: arrivals[i])
    seqs, step = {}, 0
    while pending or engine.has_work():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            prompt, params = requests[i]
            (seqs[i],) = engine.add_request(prompt, params)
        engine.step()
        if watch is not None:
            watch(engine)
        step += 1
        assert step < 10_000
    return seqs


def check_block_bound(engine: LLMEngine):
    bs = engine.config.block_size
    for seq in engine.scheduler.running:
        assert len(seq.block_table) <= math.ceil(len(seq.all_ids) / bs) + 1


def test_continuous_batching_equals_transformers_generate(models):
    hf, model = models
    engine = make_engine(model, max_num_seqs=4, max_num_batched_tokens=16)
    batch = prompts(10)
    new = [3 + (7 * i) % 11 for i in range(10)]
    requests = [(p, SamplingParams(temperature=0, max_tokens=n)) for p, n in zip(batch, new)]
    got = run(engine, requests, arrivals=[0, 0, 1, 3, 3, 4, 8, 9, 9, 15], watch=check_block_bound)
    stepper = ModelStepper(model)
    for i, prompt in enumerate(batch):
        assert got[i].output_ids == hf_greedy(hf, prompt, new[i]), i
        alone = generate(stepper, torch.tensor([prompt]), max_new_tokens=new[i], eos_token_id=None)
        assert got[i].output_ids == alone[0, len(prompt) :].tolist(), i  # per-request generation
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_preemption_keeps_the_tokens(models):
    hf, model = models
    # 12 blocks of 4 slots: three long sequences cannot all stay resident
    engine = make_engine(model, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=24)
    batch = prompts(6, seed=1)
    requests = [(p, SamplingParams(temperature=0, max_tokens=20)) for p in batch]
    got = run(engine, requests, arrivals=[0] * 6, watch=check_block_bound)
    assert sum(seq.preemptions for seq in got.values()) > 0
    assert engine.allocator.num_free == engine.allocator.num_blocks
    for i, prompt in enumerate(batch):
        assert got[i].output_ids == hf_greedy(hf, prompt, 20), i


def test_seeded_sampling_does_not_depend_on_the_batch(models):
    _, model = models
    prompt = prompts(1, seed=3)[0]
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=7)
    alone = run(make_engine(model), [(prompt, params)], [0])[0].output_ids
    crowd = [(p, SamplingParams(temperature=1.0, max_tokens=10)) for p in prompts(5, seed=4)]
    together = run(make_engine(model), crowd + [(prompt, params)], [0, 0, 1, 1, 2, 1])[5].output_ids
    assert together == alone
    other_seed = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=8)
    assert run(make_engine(model), [(prompt, other_seed)], [0])[0].output_ids != alone
