"""Text generation: greedy and beam search equal transformers' ``generate`` token for token
(GPT-2, Llama with GQA, T5) including eos handling, penalties and left-padded batches; the
pipeline equals transformers' pipelines; seeded sampling; the explicit KV cache; stop
strings and streaming; tp / pp / dp layouts equal one process; bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from generation_helpers import KINDS, PROMPTS, make_generation_dirs
from launch import torchrun

from libai import dist
from libai.inference.generation import GenerationConfig, KVCache, ModelStepper, generate
from libai.inference.generation import logits_process as lp
from libai.inference.text_generation import TextGenerationPipeline
from libai.models.utils import load_huggingface

HF_CLASSES = {
    "gpt2": transformers.GPT2LMHeadModel,
    "llama": transformers.LlamaForCausalLM,
    "t5": transformers.T5ForConditionalGeneration,
}
SEARCHES = [
    dict(max_new_tokens=12),
    dict(max_new_tokens=12, num_beams=3),
    dict(max_new_tokens=10, num_beams=4, num_return_sequences=2, length_penalty=0.5),
    dict(max_new_tokens=10, repetition_penalty=1.3, no_repeat_ngram_size=2),
    dict(max_new_tokens=10, num_beams=3, no_repeat_ngram_size=2, min_new_tokens=4),
]
EOS_SEARCHES = [
    dict(max_new_tokens=12),
    dict(max_new_tokens=12, num_beams=3),
    dict(max_new_tokens=12, num_beams=4, num_return_sequences=3, length_penalty=2.0),
    dict(max_new_tokens=12, num_beams=3, early_stopping=True),
    dict(max_new_tokens=12, num_beams=3, early_stopping="never", length_penalty=1.5),
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return make_generation_dirs(tmp_path_factory.mktemp("generation"))


@pytest.fixture(scope="module")
def single():
    return dist.setup_dist_util()


def prompt_batch(vocab: int):
    """Three random prompts, two of them left-padded."""
    ids = torch.randint(3, vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def special_ids(hf, eos: int) -> dict:
    if hf.config.is_encoder_decoder:
        return dict(eos_token_id=eos, pad_token_id=0, decoder_start_token_id=0)
    return dict(eos_token_id=eos)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_and_beam_equal_transformers(dirs, single, kind):
    hf = HF_CLASSES[kind].from_pretrained(dirs[kind]).eval()
    stepper = ModelStepper(load_huggingface(dirs[kind]).eval())
    ids, mask = prompt_batch(hf.config.vocab_size)
    eos = hf.config.eos_token_id

    def compare(settings, eos):
        hf.generation_config.eos_token_id = eos
        want = hf.generate(ids, attention_mask=mask, do_sample=False, **settings)
        got = generate(stepper, ids, mask, **settings, **special_ids(hf, eos))
        assert got.shape == want.shape and torch.equal(got, want), (settings, eos, got, want)

    for settings in SEARCHES:
        compare(settings, eos)
    # eos tokens the model does produce: finished rows are padded, beams end early
    first = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6)
    start = 1 if hf.config.is_encoder_decoder else ids.shape[1]
    for produced in {int(first[0, start + 2]), int(first[1, start + 1])}:
        for settings in EOS_SEARCHES:
            compare(settings, produced)


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_equals_transformers_and_batches_equal_single_prompts(dirs, kind):
    pipe = TextGenerationPipeline(model_path=dirs[kind], mode="huggingface")
    for settings in (dict(max_new_tokens=8), dict(max_new_tokens=8, num_beams=3)):
        ours = pipe(PROMPTS, **settings)
        assert [pipe(p, **settings) for p in PROMPTS] == ours  # left padding changes nothing
        if kind == "t5":
            hf = transformers.T5ForConditionalGeneration.from_pretrained(dirs[kind])
            tok = transformers.AutoTokenizer.from_pretrained(dirs[kind])
            theirs = []
            for p in PROMPTS:
                out = hf.generate(**tok(p, return_tensors="pt"), do_sample=False, **settings)
                theirs.append([{"generated_text": tok.decode(out[0], skip_special_tokens=True)}])
        else:
            reference = transformers.pipeline("text-generation", model=dirs[kind])
            theirs = reference(PROMPTS, do_sample=False, **settings)
        assert ours == theirs


def test_sampling_is_seeded(dirs):
    pipe = TextGenerationPipeline(model_path=dirs["llama"], mode="huggingface")
    settings = dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.8, max_new_tokens=10)
    first = pipe(PROMPTS, seed=3, num_return_sequences=2, **settings)
    assert pipe(PROMPTS, seed=3, num_return_sequences=2, **settings) == first
    assert all(len(r) == 2 for r in first)
    others = [pipe(PROMPTS, seed=s, num_return_sequences=2, **settings) for s in (4, 5)]
    assert any(o != first for o in others)


def test_processors_equal_transformers():
    from transformers.generation import logits_process as hf

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 9), generator=g)
    ids[:, 3:6] = ids[:, 0:3]  # repeated n-grams
    scores = torch.randn(4, 50, generator=g) * 3
    pairs = [
        (lp.repetition_penalty(1.7), hf.RepetitionPenaltyLogitsProcessor(1.7)),
        (lp.no_repeat_ngram(2), hf.NoRepeatNGramLogitsProcessor(2)),
        (lp.no_repeat_ngram(3), hf.NoRepeatNGramLogitsProcessor(3)),
        (lp.min_new_tokens(5, 6, [7, 9]), hf.MinNewTokensLengthLogitsProcessor(6, 5, [7, 9])),
        (lp.temperature(0.7), hf.TemperatureLogitsWarper(0.7)),
        (lp.top_k(5), hf.TopKLogitsWarper(5)),
        (lp.top_p(0.8), hf.TopPLogitsWarper(0.8)),
        (lp.top_p(0.3, 2), hf.TopPLogitsWarper(0.3, min_tokens_to_keep=2)),
    ]
    for ours, theirs in pairs:
        assert torch.equal(ours(ids, scores.clone()), theirs(ids, scores.clone())), theirs


def test_kv_cache_is_an_explicit_gqa_aware_object(dirs, single):
    model = load_huggingface(dirs["llama"]).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {id(m): set(vars(m)) for m in model.modules()}
    stepper = ModelStepper(model)
    ids, mask = prompt_batch(100)
    generate(stepper, ids, mask, max_new_tokens=5, eos_token_id=None)
    cache = stepper.cache
    assert isinstance(cache, KVCache) and sorted(cache.layers) == [0, 1, 2, 3]
    for layer in cache.layers.values():
        keys, values = layer.get()
        # kv heads only (2 of 4 query heads), one preallocated buffer of prompt + new tokens;
        # the last new token is never fed back
        assert keys.shape == values.shape == (3, 2, 11, 8)
        assert layer._keys.shape[2] == 12 and layer.cross is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {id(m): set(vars(m)) for m in model.modules()} == attrs  # no state on modules
    # without max_length the buffers grow; reorder keeps rows
    grow = KVCache()
    layer = grow.layer(5)
    for step in range(5):
        layer.update(torch.full((2, 1, 3, 4), float(step)), torch.zeros(2, 1, 3, 4))
    assert layer.get()[0].shape == (2, 1, 15, 4) and grow.get_seq_length() == 15
    layer.update(torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    grow.reorder(torch.tensor([1, 1]))
    assert layer.get()[0][:, 0, -1, 0].tolist() == [1.0, 1.0]


def test_stop_strings_and_streamer(dirs):
    pipe = TextGenerationPipeline(model_path=dirs["gpt2"], mode="huggingface")
    prompt = PROMPTS[0]
    full = pipe(prompt, max_new_tokens=12)[0]["generated_text"][len(prompt) :]
    stop = full[4:6]  # ends inside the continuation
    cut = pipe(prompt, max_new_tokens=12, stop_strings=stop)[0]["generated_text"][len(prompt) :]
    assert stop in cut and len(cut) < len(full) and full.startswith(cut)
    streamed = []
    pipe(PROMPTS, max_new_tokens=5, streamer=lambda t: streamed.append(t.tolist()))
    assert len(streamed) == 5 and all(len(s) == len(PROMPTS) for s in streamed)
    with pytest.raises(ValueError, match="streamer is not supported with beam"):
        pipe(prompt, num_beams=2, streamer=print)


def test_bad_input_is_a_clear_error(dirs, single, tmp_path):
    pipe = TextGenerationPipeline(model_path=dirs["gpt2"], mode="huggingface")
    with pytest.raises(ValueError, match="empty prompt"):
        pipe("   ")
    with pytest.raises(ValueError, match=r"needs \d+ positions but the model has 64"):
        pipe("hello " * 40, max_new_tokens=12)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['max_tokens'\]"):
        pipe("hello", max_tokens=3)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['beams'\]"):
        TextGenerationPipeline(model_path=dirs["gpt2"], mode="huggingface", beams=2)
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        pipe("hello", max_new_tokens=-1)
    with pytest.raises(ValueError, match="unknown generation argument"):
        GenerationConfig().updated(temprature=0.5)
    stepper = ModelStepper(load_huggingface(dirs["gpt2"]).eval())
    with pytest.raises(ValueError, match="empty prompt"):
        generate(stepper, torch.zeros(1, 0, dtype=torch.long))
    no_weights = tmp_path / "no_weights"
    shutil.copytree(dirs["gpt2"], no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(Exception, match="no_weights"):
        TextGenerationPipeline(model_path=str(no_weights), mode="huggingface")
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{dirs['gpt2']}/{name}", no_tokenizer / name)
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        TextGenerationPipeline(model_path=str(no_tokenizer), mode="huggingface")


def test_parallel_generation_equals_one_process(dirs, tmp_path):
    """tp2 x pp2 (even and custom stage ids), dp2 x tp2 and dp2 x pp2 (custom) on 4 ranks."""
    calls = {
        "greedy": dict(max_new_tokens=8),
        "beam": dict(max_new_tokens=6, num_beams=3, num_return_sequences=2),
        "sample": dict(max_new_tokens=6, do_sample=True, seed=7, top_k=30, top_p=0.95),
    }
    expected = {}
    for kind, path in dirs.items():
        pipe = TextGenerationPipeline(model_path=path, mode="huggingface")
        for name, call in calls.items():
            expected[f"{kind}/{name}"] = pipe(PROMPTS, **call)
    custom = {"gpt2": [0, 0, 0, 1], "llama": [0, 1, 1, 1], "t5": [0, 0, 0, 1]}
    layouts = {
        "tp2_pp2": dict(tensor_parallel=2, pipeline_parallel=2),
        "tp2_pp2_custom": dict(tensor_parallel=2, pipeline_parallel=2, pipeline_stage_id=custom),
        "dp2_tp2": dict(data_parallel=2, tensor_parallel=2),
        "dp2_pp2_custom": dict(data_parallel=2, pipeline_parallel=2, pipeline_stage_id=custom),
    }
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            dict(dirs=dirs, prompts=PROMPTS, calls=calls, expected=expected, layouts=layouts)
        )
    )
    results = torchrun("generation_layouts.py", 4, str(spec))
    for rank, result in enumerate(results):
        assert result["ok"], result
        bad = {k: v for k, v in result.items() if k.count("/") == 2 and not k.endswith("held")}
        assert {k: v for k, v in bad.items() if v != "ok"} == {}, rank
    # what each rank holds: ranks 0, 1 are stage 0 and ranks 2, 3 stage 1 (tp innermost)
    held = [r["tp2_pp2_custom/llama/held"] for r in results]
    assert [h["layers"] for h in held] == [[0], [0], [1, 2, 3], [1, 2, 3]]
    assert all(h["kv_heads"] == [1] for h in held)  # 2 kv heads split over tp2
    whole = load_huggingface(dirs["llama"])
    total = sum(p.numel() for p in whole.parameters())
    assert max(h["params"] for h in held) < total / 2  # a tp shard of one stage each
    held = [r["dp2_pp2_custom/t5/held"] for r in results]
    assert [h["layers"] for h in held] == [[2], [2], [3], [3]]  # decoder blocks by stage
    held = [r["dp2_tp2/gpt2/held"] for r in results]
    assert all(h["layers"] == [0, 1, 2, 3] and h["kv_heads"] == [2] for h in held)
