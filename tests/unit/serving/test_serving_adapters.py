"""Several LoRA adapters served beside one base, one per request (``--lora-modules``),
against transformers + PEFT on the same base and adapter files:

- continuous batching whose steps mix base, adapter-A and adapter-B requests (arriving at
  different steps, prompts prefilled in chunks beside decoding ones) gives each request
  PEFT's greedy tokens for its own adapter (and the base's for base requests);
- each layer holds only the adapters that target it;
- bad input is refused before anything changes: an adapter that saves whole modules, an
  adapter for another base, an adapter index the model lacks.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from serving_models import VOCAB, hf_greedy, make_peft_adapter, peft_model, tiny_hf

from libai import dist
from libai.layers.lora_set import AdapterSet
from libai.layers.paged_kv_cache import PagedKVCache
from libai.models.lora import LORA_ATTR, LoRAConfig, apply_lora
from libai.models.lora_adapters import load_peft_adapters
from libai.models.utils import load_huggingface
from libai.serving import EngineConfig, LLMEngine, ModelExecutor, SamplingParams
from libai.serving.sampling import InvalidParameter

pytest.importorskip("peft")

ATTN = ["q_proj", "v_proj", "down_proj"]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL += ["embed_tokens"]  # PEFT's embedding adapter too


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    base = root / "base"
    hf = tiny_hf("llama", base)
    sql = make_peft_adapter(base, root / "sql", 1, r=4, lora_alpha=8, target_modules=ATTN)
    chat = make_peft_adapter(
        base, root / "chat", 2, r=8, lora_alpha=16, use_rslora=True, target_modules=ALL
    )
    return hf, str(base), {"sql": sql, "chat": chat}


def served_model(base: str, adapters: dict[str, str]):
    dist.setup_dist_util({})
    model = load_huggingface(base).eval()
    load_peft_adapters(model, adapters)
    return model


def make_engine(model, **sizes) -> LLMEngine:
    config = EngineConfig(**{"max_model_len": 96, "block_size": 4, **sizes})
    cache = PagedKVCache(config.blocks(), config.block_size)
    return LLMEngine(ModelExecutor(model, cache, "cpu"), config=config)


def test_mixed_adapters_in_one_batch_equal_peft(files):
    hf, base, adapters = files
    model = served_model(base, adapters)
    engine = make_engine(model, max_num_seqs=6, max_num_batched_tokens=20)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (int(n),), generator=g).tolist() for n in
               torch.randint(2, 25, (9,), generator=g)]  # fmt: skip
    choice = [-1, 0, 1, 1, 0, -1, 0, 1, -1]  # base, sql, chat
    new = [4 + (5 * i) % 9 for i in range(9)]
    arrivals = [0, 0, 0, 1, 2, 2, 4, 5, 7]
    seqs, step, pending = {}, 0, list(range(9))
    mixed_steps = 0
    while pending or engine.has_work():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            params = SamplingParams(temperature=0, max_tokens=new[i])
            (seqs[i],) = engine.add_request(prompts[i], params, adapter=choice[i])
        kinds = {s.adapter for s in engine.scheduler.running}
        mixed_steps += len(kinds) == 3
        engine.step()
        step += 1
    assert mixed_steps > 0  # some steps ran all three side by side
    references = {
        -1: hf,
        0: peft_model(base, adapters["sql"]),
        1: peft_model(base, adapters["chat"]),
    }
    for i, prompt in enumerate(prompts):
        want = hf_greedy(references[choice[i]], prompt, new[i])
        assert seqs[i].output_ids == want, (i, choice[i])
    differs = [hf_greedy(hf, prompts[i], new[i]) != seqs[i].output_ids for i in (1, 2)]
    assert all(differs)  # the adapters change the answers
    assert engine.allocator.num_free == engine.allocator.num_blocks


def test_each_layer_holds_the_adapters_that_target_it(files):
    _, base, adapters = files
    model = served_model(base, adapters)
    sets = {n: m.lora for n, m in model.named_modules() if getattr(m, "lora", None) is not None}
    assert sets and all(isinstance(s, AdapterSet) for s in sets.values())
    by_kind = {}
    for name, adapter_set in sets.items():
        by_kind.setdefault(name.split(".", 3)[-1], set()).add(tuple(adapter_set.adapters))
    # q/v (fused qkv) and down_proj: both adapters; o_proj, gate/up and the embedding: "chat"
    assert by_kind == {
        "self_attention.query_key_value": {("0", "1")},
        "mlp.dense_4h_to_h": {("0", "1")},
        "self_attention.dense": {("1",)},
        "mlp.dense_h_to_4h": {("1",)},
        "mlp.dense_gate": {("1",)},
        "embed_tokens": {("1",)},
    }, by_kind
    ranks = {
        i: {a.adapters[str(i)].r for a in sets.values() if str(i) in a.adapters} for i in (0, 1)
    }
    assert ranks == {0: {4}, 1: {8}}


def test_bad_adapters_are_refused_before_anything_changes(files, tmp_path):
    hf, base, adapters = files
    saves_modules = make_peft_adapter(
        base, tmp_path / "whole", 3, r=4, target_modules=ATTN, modules_to_save=["lm_head"]
    )
    dist.setup_dist_util({})
    model = load_huggingface(base).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"adapter 'whole'.*saves whole modules"):
        load_peft_adapters(model, {"sql": adapters["sql"], "whole": saves_modules})
    assert all(getattr(m, "lora", None) is None for m in model.modules())
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)

    other = tmp_path / "other_base"
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(other)
    foreign = make_peft_adapter(other, tmp_path / "foreign", 4, r=4, target_modules=ATTN)
    with pytest.raises(ValueError, match=r"adapter 'foreign'.*another base"):
        load_peft_adapters(model, {"foreign": foreign})
    assert LORA_ATTR not in model.__dict__  # the failed one's adapters taken off again
    assert all(getattr(m, "lora", None) is None for m in model.modules())

    load_peft_adapters(model, {"sql": adapters["sql"]})
    assert LORA_ATTR not in model.__dict__  # served adapters do not make it a LoRA (training) model
    engine = make_engine(model)
    with pytest.raises(InvalidParameter, match="adapter 1 is not loaded"):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), adapter=1)
    with pytest.raises(ValueError, match="already carries LoRA adapters"):
        load_peft_adapters(model, {"chat": adapters["chat"]})
    trained = load_huggingface(base).eval()  # a model with one (trainable) adapter attached
    apply_lora(trained, LoRAConfig(target_modules=("q_proj",), r=2))
    with pytest.raises(ValueError, match="already carries LoRA adapters"):
        load_peft_adapters(trained, {"sql": adapters["sql"]})
