"""Decoding with the static KV cache and the compiled decode step: greedy, seeded sampling
and beam search give the same tokens as the dynamic cache and as transformers (GPT-2,
Llama with GQA, Qwen2 with q/k/v biases, T5) on left-padded batches; the compiled step
compiles once for a whole 16-token generation (and for the next generations of the same
shapes); the cache's buffers keep their shapes and addresses from step to step; a request
longer than the cache fails with a clear error; the pipeline takes the options; tp2 and pp2
equal one process."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from generation_helpers import PROMPTS, make_generation_dirs, make_gpt2_dir
from launch import torchrun
from torch._dynamo.utils import counters

from libai import dist
from libai.inference.generation import GenerationConfig, ModelStepper, StaticKVCache, generate
from libai.inference.text_generation import TextGenerationPipeline
from libai.models.utils import load_huggingface

VOCAB = 96
NEW = 16  # tokens per generation
CACHE = 24  # max_cache_len of the compiled steppers: prompt 7 + 16 new (T5: 1 + 16)
DECODER = dict(vocab_size=VOCAB, initializer_range=0.3)  # peaked: no near-ties
LLAMA = dict(
    **DECODER,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: only the 2 kv heads are cached
    max_position_embeddings=64,
)


def build_hf(kind: str):
    torch.manual_seed(len(kind))
    if kind == "gpt2":
        config = transformers.GPT2Config(**DECODER, n_positions=64, n_embd=32, n_layer=2, n_head=4)
        return transformers.GPT2LMHeadModel(config)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    if kind == "qwen2":  # biases on q, k, v
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**LLAMA))
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        initializer_factor=3.0,
    )
    return transformers.T5ForConditionalGeneration(config)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``get(kind) -> (hf model, libai model)`` with the same weights, built once."""
    dist.setup_dist_util()
    root, made = tmp_path_factory.mktemp("static"), {}

    def get(kind):
        if kind not in made:
            hf = build_hf(kind).eval()
            hf.save_pretrained(root / kind)
            made[kind] = hf, load_huggingface(str(root / kind)).eval()
        return made[kind]

    return get


def prompts():
    """Three prompts of 7 tokens, two of them left-padded."""
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def special(hf) -> dict:
    ids = dict(eos_token_id=None, pad_token_id=0)
    return dict(ids, decoder_start_token_id=0) if hf.config.is_encoder_decoder else ids


def hf_generate(hf, ids, mask, **settings):
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.generate(ids, attention_mask=mask, do_sample=False, **settings)


KINDS = ["gpt2", "llama", "qwen2", "t5"]
STATIC_KEYS = ("cache_implementation", "max_cache_len", "compile")
#: the searches of the compiled stepper: all on 3 rows, so one compiled step serves them
GREEDY = dict(max_new_tokens=NEW)
SAMPLE = dict(max_new_tokens=NEW, do_sample=True, seed=5, top_k=20, temperature=0.8)
BEAM = dict(max_new_tokens=NEW, num_beams=3, num_return_sequences=2, length_penalty=0.7)


@pytest.mark.not_under_mutation(
    reason="torch.compile traces mutmut's trampolines: 20 graphs where one is asserted"
)
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_static_equals_dynamic_and_transformers(models, kind):
    hf, model = models(kind)
    ids, mask = prompts()
    dynamic = ModelStepper(model)
    compiled = ModelStepper(model, compile=True, max_cache_len=CACHE)
    assert compiled.compile_mode == "default"  # CPU: Inductor without CUDA graphs
    torch._dynamo.reset()
    counters.clear()

    shapes, addresses = set(), set()

    def watch(_tokens):  # after every step: the buffers of every layer
        for layer in compiled.cache.layers.values():
            shapes.add(tuple(layer.get()[0].shape))
            addresses.add((layer.get()[0].data_ptr(), layer.get()[1].data_ptr()))

    got = generate(compiled, ids, mask, **GREEDY, **special(hf), streamer=watch)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for 15 single-token steps
    assert counters["graph_break"] == {}
    fused = not hf.config.is_encoder_decoder  # greedy: bookkeeping and argmax in the graph
    assert (compiled._compiled_greedy is not None) == fused
    assert (compiled._compiled is None) == fused
    greedy = generate(dynamic, ids, mask, **GREEDY, **special(hf))
    assert torch.equal(got, greedy)
    assert torch.equal(got, hf_generate(hf, ids, mask, **GREEDY))
    kv_heads = 2 if kind in ("llama", "qwen2") else 4
    assert shapes == {(3, kv_heads, CACHE, 8)}  # whole buffers, kv heads only, every step
    layers = len(compiled.cache.layers)
    assert len(addresses) == layers  # written in place

    # sampling and beam search (one prompt, 3 beams = 3 rows) reuse the compiled step
    with torch._dynamo.config.patch(error_on_recompile=True):
        for settings, rows in ((SAMPLE, slice(None)), (BEAM, slice(1, 2))):
            got = generate(compiled, ids[rows], mask[rows], **settings, **special(hf))
            want = generate(dynamic, ids[rows], mask[rows], **settings, **special(hf))
            assert torch.equal(got, want), settings
        # greedy again with an eos that ends a row early (padding after it): the greedy
        # step reloads its buffers and replays its graph
        start = greedy.shape[1] - NEW  # decoder-only: the prompt; T5: the start token
        settings = dict(GREEDY, eos_token_id=int(greedy[0, start + 2]), pad_token_id=0)
        got = generate(compiled, ids, mask, **special(hf) | settings)
        assert torch.equal(got, generate(dynamic, ids, mask, **special(hf) | settings))
    assert (got[0, start + 3 :] == 0).all() and not torch.equal(got, greedy)
    assert counters["stats"]["unique_graphs"] == 1 + fused  # the greedy step, the sampling one
    assert len(addresses) == layers  # the next generations reused the cache


@pytest.mark.parametrize("kind", KINDS)
def test_static_cache_equals_dynamic_and_transformers(models, kind):
    """Eager static cache on wider searches: greedy and beam == dynamic == transformers."""
    hf, model = models(kind)
    ids, mask = prompts()
    dynamic, static = ModelStepper(model), ModelStepper(model, static_cache=True)
    for settings in (
        dict(max_new_tokens=10),
        dict(max_new_tokens=10, num_beams=3),
        dict(max_new_tokens=9, num_beams=4, num_return_sequences=2, length_penalty=0.5),
        dict(max_new_tokens=10, repetition_penalty=1.3, no_repeat_ngram_size=2),
    ):
        got = generate(static, ids, mask, **settings, **special(hf))
        assert isinstance(static.cache, StaticKVCache)
        assert torch.equal(got, generate(dynamic, ids, mask, **settings, **special(hf)))
        assert torch.equal(got, hf_generate(hf, ids, mask, **settings)), settings
    # per call: a dynamic-cache stepper runs the static cache, and back
    got = generate(dynamic, ids, mask, **SAMPLE, **special(hf), cache_implementation="static")
    assert isinstance(dynamic.cache, StaticKVCache)
    assert torch.equal(got, generate(static, ids, mask, **SAMPLE, **special(hf)))
    generate(static, ids, mask, max_new_tokens=2, **special(hf), cache_implementation="dynamic")
    assert not isinstance(static.cache, StaticKVCache)


def test_too_long_for_the_cache_and_bad_settings_are_clear_errors(models):
    _, model = models("gpt2")
    ids, mask = prompts()
    stepper = ModelStepper(model, static_cache=True, max_cache_len=CACHE)
    with pytest.raises(ValueError, match=r"max_cache_len=24 positions but .* need 25"):
        generate(stepper, ids, mask, max_new_tokens=CACHE - 7 + 1)
    with pytest.raises(ValueError, match=r"max_cache_len=10 positions but .* need 23"):
        generate(ModelStepper(model), ids, mask, max_new_tokens=NEW, cache_implementation="static", max_cache_len=10)  # fmt: skip
    cache = StaticKVCache(8)
    cache.step(0, 6)
    with pytest.raises(ValueError, match="max_length=8 positions but this step needs 9"):
        cache.step(6, 3)
    with pytest.raises(ValueError, match="compile.*needs cache_implementation='static'"):
        GenerationConfig().updated(compile=True, cache_implementation="dynamic")
    with pytest.raises(ValueError, match="cache_implementation='paged'"):
        GenerationConfig().updated(cache_implementation="paged")
    with pytest.raises(ValueError, match="max_cache_len=0"):
        GenerationConfig().updated(max_cache_len=0)
    # a call's "dynamic" turns a compiling stepper's defaults off
    stepper = ModelStepper(model, compile=True)
    generate(stepper, ids, mask, max_new_tokens=2, cache_implementation="dynamic")
    assert not isinstance(stepper.cache, StaticKVCache) and not stepper.compiled_step


def test_static_cache_object():
    """Writes at tensor positions, in place; beam reorder and reset keep the buffers."""
    cache = StaticKVCache(6)
    layer = cache.layer(3)
    cache.step(0, 2)
    keys = torch.arange(2.0 * 2).view(2, 1, 2, 1).expand(2, 1, 2, 4)
    full_k, full_v = layer.update(keys, -keys)
    assert full_k.shape == (2, 1, 6, 4) and cache.get_seq_length() == 2
    assert full_k[:, 0, 2:].abs().sum() == 0  # slots not written hold zeros
    pointer = full_k.data_ptr()
    cache.step(2, 1)
    layer.update(torch.full((2, 1, 1, 4), 9.0), torch.zeros(2, 1, 1, 4))
    cache.reorder(torch.tensor([1, 1]))
    k, v = layer.get()
    assert k.data_ptr() == pointer and k[:, 0, :3, 0].tolist() == [[2.0, 3.0, 9.0]] * 2
    assert v[:, 0, :2, 0].tolist() == [[-2.0, -3.0]] * 2
    cache.reset()
    assert layer.get()[0].data_ptr() == pointer and layer.get()[0].abs().sum() == 0


def test_pipeline_takes_the_options(tmp_path):
    path = make_gpt2_dir(tmp_path)
    default = TextGenerationPipeline(model_path=path, mode="huggingface")
    static = TextGenerationPipeline(
        model_path=path, mode="huggingface", cache_implementation="static"
    )
    for settings in (dict(max_new_tokens=8), dict(max_new_tokens=6, num_beams=3)):
        want = default(PROMPTS, **settings)
        assert static(PROMPTS, **settings) == want
        assert default(PROMPTS, **settings, cache_implementation="static") == want
    assert isinstance(static.stepper.cache, StaticKVCache)


def test_tensor_and_pipeline_parallel_static_generation(tmp_path):
    """tp2 and pp2 (2 ranks, tests/support/dist_scripts/generation_layouts.py): the static cache
    returns exactly the single-process dynamic-cache text; under tp each rank caches its own
    kv head of the 2 (Llama), under pp its stage's layers. (The compiled step under tp2 / pp2
    also matches, but compiling in two fresh processes costs ~30 s, so it is not run here.)"""
    dirs = make_generation_dirs(tmp_path)
    calls = {
        "static": dict(max_new_tokens=6, cache_implementation="static"),
        "static_beam": dict(max_new_tokens=5, num_beams=3, cache_implementation="static"),
    }
    expected = {}
    for kind, path in dirs.items():
        pipe = TextGenerationPipeline(model_path=path, mode="huggingface")
        for name, call in calls.items():
            plain = {k: v for k, v in call.items() if k not in STATIC_KEYS}
            expected[f"{kind}/{name}"] = pipe(PROMPTS, **plain)
    layouts = {"tp2": dict(tensor_parallel=2), "pp2": dict(pipeline_parallel=2)}
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            dict(dirs=dirs, prompts=PROMPTS, calls=calls, expected=expected, layouts=layouts)
        )
    )
    results = torchrun("generation_layouts.py", 2, str(spec))
    for rank, result in enumerate(results):
        assert result["ok"], result
        bad = {k: v for k, v in result.items() if k.count("/") == 2 and not k.endswith("held")}
        assert {k: v for k, v in bad.items() if v != "ok"} == {}, rank
    assert [r["tp2/llama/held"]["kv_heads"] for r in results] == [[1], [1]]
    assert [r["pp2/llama/held"]["layers"] for r in results] == [[0, 1], [2, 3]]
