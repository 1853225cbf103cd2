"""LoRA on one process against Hugging Face PEFT on the same weights:

- an adapter made by ``peft`` (Llama: q/k/v/o and the MLP; GPT-2: the fused ``c_attn`` and
  the Conv1D projections) loads here and gives PEFT's logits;
- our adapter, exported as a PEFT directory, loads with ``PeftModel.from_pretrained`` and
  gives our logits; merged, our weights equal ``merge_and_unload()``'s;
- the forward against the formula ``base + scaling * B A x`` (rsLoRA's scaling too);
- a frozen base: after backward only adapter parameters hold gradients, and the optimizer
  steps only them;
- bad input (no matching layer, a rank above the layer, an adapter for another base, an
  unknown key) is one line before any weight changes.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from libai import dist
from libai.models.lora import LoRAConfig, apply_lora, lora_layers, merge_lora
from libai.models.lora_peft import load_peft_adapter, read_peft_config, save_peft_adapter
from libai.models.utils import load_huggingface, save_huggingface

peft = pytest.importorskip("peft")

VOCAB = 61
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def tiny_hf(kind: str, path):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(path)
    return model.eval()


def ids():
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))


def ours_logits(model, x):
    with torch.no_grad():
        out = model(x) if not hasattr(model, "GPT_model") else model.GPT_model(x)
    logits = out["logits"] if isinstance(out, dict) else out
    return logits.float()


def randomize_peft(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def randomize_ours(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if getattr(p, "libai_lora", False):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.mark.parametrize(
    "kind, targets, rslora",
    [("llama", LLAMA_TARGETS, False), ("llama", ["q_proj", "v_proj"], True),
     ("gpt2", ["c_attn", "c_proj", "c_fc"], False),
     # PEFT's embedding adapters (Llama's untied embed_tokens, GPT-2's wte tied to its head)
     ("llama", ["embed_tokens", "v_proj"], True), ("gpt2", ["wte", "c_attn"], False)],
)  # fmt: skip
def test_peft_adapters_load_here_and_ours_load_in_peft(tmp_path, kind, targets, rslora):
    hf = tiny_hf(kind, tmp_path / "base")
    x = ids()
    settings = dict(r=4, lora_alpha=8, target_modules=targets, use_rslora=rslora)
    theirs = peft.get_peft_model(
        hf, peft.LoraConfig(**settings, fan_in_fan_out=kind == "gpt2")
    ).eval()
    randomize_peft(theirs)
    theirs.save_pretrained(tmp_path / "theirs")
    want = theirs(x).logits.float()

    ours = load_huggingface(str(tmp_path / "base")).eval()
    config = load_peft_adapter(ours, str(tmp_path / "theirs"))
    assert config.r == 4 and config.use_rslora == rslora
    torch.testing.assert_close(ours_logits(ours, x), want, atol=1e-5, rtol=1e-5)

    # the other way: our (changed) adapter, exported, loads in PEFT
    randomize_ours(ours)
    save_peft_adapter(ours, config, str(tmp_path / "ours"), str(tmp_path / "base"))
    base = type(hf).from_pretrained(tmp_path / "base").eval()
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "ours").eval()
    mine = ours_logits(ours, x)
    assert (mine - want).abs().max() > 1e-3  # the adapter changed
    torch.testing.assert_close(loaded(x).logits.float(), mine, atol=1e-5, rtol=1e-5)

    # merged: PEFT's merge_and_unload logits (the unmerged ones, but where a merged
    # embedding also moves the head tied to it, in PEFT as here) and weights
    merged_theirs = loaded.merge_and_unload()
    adapted = lora_layers(ours)
    assert merge_lora(ours) == len(adapted) > 0
    assert not lora_layers(ours)
    tied_embedding = kind == "gpt2" and "wte" in targets
    want_merged = merged_theirs(x).logits.float() if tied_embedding else mine
    torch.testing.assert_close(ours_logits(ours, x), want_merged, atol=1e-5, rtol=1e-5)
    save_huggingface(ours, str(tmp_path / "merged"))
    exported = type(hf).from_pretrained(tmp_path / "merged").state_dict()
    for name, value in merged_theirs.state_dict().items():
        if name in exported:
            torch.testing.assert_close(exported[name], value, atol=1e-6, rtol=0)


def randomize_trained(model, seed=4):
    """Random values in every trained parameter (adapters and modules_to_save)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def test_modules_to_save_train_whole_and_travel_in_peft_adapters(tmp_path):
    """PEFT's ``modules_to_save`` (by Hugging Face name or libai's): those modules train
    whole; the export carries their weights as PEFT does (``peft.PeftModel`` gives our
    logits), and a PEFT adapter with modules_to_save loads here with PEFT's logits."""
    hf = tiny_hf("llama", tmp_path / "base")
    x = ids()
    ours = load_huggingface(str(tmp_path / "base")).eval()
    settings = LoRAConfig(
        target_modules=("q_proj", "v_proj"), r=4, modules_to_save=("lm_head", "o_proj")
    )
    apply_lora(ours, settings)
    trained = {n for n, p in ours.named_parameters() if p.requires_grad}
    dense = {f"model.layers.{i}.self_attention.dense.weight" for i in range(2)}  # HF o_proj
    assert {"lm_head.weight", *dense} <= trained
    assert not any("embed" in n or "dense_h_to_4h" in n for n in trained)
    randomize_trained(ours)
    save_peft_adapter(ours, settings, str(tmp_path / "ours"))
    written = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    assert written["modules_to_save"] == [
        "lm_head", "model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj",
    ]  # fmt: skip
    base = type(hf).from_pretrained(tmp_path / "base").eval()
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "ours").eval()
    mine = ours_logits(ours, x)
    assert (mine - hf(x).logits).abs().max() > 1e-2  # the saved modules changed the output
    torch.testing.assert_close(loaded(x).logits.float(), mine, atol=1e-5, rtol=1e-5)

    # PEFT's own: suffix "norm" saves every norm (PEFT matches names by suffix)
    hf = tiny_hf("llama", tmp_path / "base2")
    theirs = peft.get_peft_model(
        hf, peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head", "norm"])
    ).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    theirs.save_pretrained(tmp_path / "theirs")
    fresh = load_huggingface(str(tmp_path / "base2")).eval()
    config = load_peft_adapter(fresh, str(tmp_path / "theirs"))
    assert "model.layers.1.input_layernorm" in config.modules_to_save
    torch.testing.assert_close(
        ours_logits(fresh, x), theirs(x).logits.float(), atol=1e-5, rtol=1e-5
    )

    # an adapter whose saved module does not fit this model: one line, nothing loaded
    other = load_huggingface(str(tmp_path / "base2")).eval()
    apply_lora(other, LoRAConfig(target_modules=("q_proj",), r=4))  # lm_head stays frozen
    with pytest.raises(ValueError, match=r"lm_head.weight .*fits no trained module"):
        load_peft_adapter(other, str(tmp_path / "theirs"))


def test_forward_is_base_plus_scaled_low_rank_product(tmp_path):
    tiny_hf("llama", tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"))
    apply_lora(model, LoRAConfig(target_modules=("down_proj",), r=3, lora_alpha=6, use_rslora=True))
    randomize_ours(model)
    layer = model.model.layers["0"].mlp.dense_4h_to_h
    x = torch.randn(2, 5, 48)
    base = x @ layer.weight.T
    scaling = 6 / 3**0.5
    want = base + scaling * (x @ layer.lora.lora_A.T) @ layer.lora.lora_B.T
    torch.testing.assert_close(layer(x), want, atol=1e-6, rtol=1e-6)


def test_the_base_is_frozen(tmp_path):
    tiny_hf("llama", tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"))
    adapted = apply_lora(model, LoRAConfig(target_modules=("q_proj", "o_proj"), r=2))
    assert adapted == [f"model.layers.{i}.self_attention.{n}" for i in (0, 1)
                       for n in ("dense", "query_key_value")]  # fmt: skip
    randomize_ours(model)
    model.train()
    model(ids(), labels=ids())["lm_loss"].backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trainable == with_grad
    assert trainable and all(".lora." in n for n in trainable)
    # q only: the fused projection holds an adapter for its q rows, none for k and v
    qkv = model.model.layers["0"].self_attention.query_key_value.lora
    assert qkv.segments == ("q",)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    optimizer.step()
    assert {id(p) for p in optimizer.state} == {
        id(p) for n, p in model.named_parameters() if n in trainable
    }


def test_bad_input_is_one_line(tmp_path):
    tiny_hf("llama", tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"))
    with pytest.raises(ValueError, match=r"'qproj' matches no Linear or embedding layer .*q_proj"):
        apply_lora(model, LoRAConfig(target_modules=("qproj",)))
    with pytest.raises(ValueError, match=r"lora.r=40 exceeds .*smaller dimension \(32\)"):
        apply_lora(model, LoRAConfig(target_modules=("o_proj",), r=40))
    assert not lora_layers(model)  # nothing attached by the failed calls
    with pytest.raises(ValueError, match=r"unknown lora key\(s\) 'rank'"):
        LoRAConfig.of({"target_modules": ["q_proj"], "rank": 4})
    # an adapter made for another base: wider hidden size
    other = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )  # fmt: skip
    )
    peft.get_peft_model(other, peft.LoraConfig(r=2, target_modules=["o_proj"])).save_pretrained(
        tmp_path / "other"
    )
    assert read_peft_config(str(tmp_path / "other")).target_modules == ("o_proj",)
    fresh = load_huggingface(str(tmp_path / "base"))
    before = {n: p.clone() for n, p in fresh.named_parameters()}
    with pytest.raises(ValueError, match="an adapter for another base model"):
        load_peft_adapter(fresh, str(tmp_path / "other"))
    for n, p in fresh.named_parameters():
        if n in before:
            assert torch.equal(p, before[n])
    # an embedding adapter made on a table of the same shape but other values: PEFT saved
    # that table beside it (save_embedding_layers), and it is not this base's
    torch.manual_seed(7)
    same_shape = transformers.LlamaForCausalLM(
        transformers.AutoConfig.from_pretrained(tmp_path / "base")
    )
    peft.get_peft_model(
        same_shape, peft.LoraConfig(r=2, target_modules=["embed_tokens"])
    ).save_pretrained(tmp_path / "other_table")
    with pytest.raises(ValueError, match=r"embed_tokens.base_layer.weight .* differs from"):
        load_peft_adapter(fresh, str(tmp_path / "other_table"))
    for n, p in fresh.named_parameters():
        if n in before:
            assert torch.equal(p, before[n])


def test_o2_keeps_fp32_adapters_beside_a_low_precision_base(tmp_path):
    """Mixed precision O2 casts the frozen base to bf16 and keeps the adapters in fp32: the
    optimizer steps the adapters themselves (no master copies, none for the base either),
    and the base does not move."""
    from libai.runtime.master_weights import MasterWeights
    from libai.runtime.parallel import ModelRunner

    tiny_hf("llama", tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"))
    apply_lora(model, LoRAConfig(target_modules=("q_proj", "down_proj"), r=2))
    randomize_ours(model)
    runner = ModelRunner(model, amp_dtype=torch.bfloat16)
    master = MasterWeights(runner.model, torch.bfloat16)
    master.cast_model()
    adapters = [p for p in model.parameters() if getattr(p, "libai_lora", False)]
    base = model.model.layers["0"].mlp.dense_4h_to_h.weight
    assert all(p.dtype == torch.float32 for p in adapters) and base.dtype == torch.bfloat16
    optimizer = master.attach(
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    )
    assert master.pairs == [] and master._fp32_start == {}
    before, adapter_before = base.detach().clone(), adapters[0].detach().clone()
    runner.forward_backward({"input_ids": ids(), "labels": ids()})
    runner.optimizer_step(optimizer)
    assert torch.equal(base, before) and base.grad is None
    assert not torch.equal(adapters[0], adapter_before)


@pytest.mark.not_under_mutation(
    reason="torch.compile traces mutmut's trampolines around each function"
)
def test_compiled_blocks_train_the_adapters_as_eager(tmp_path):
    """``torch.compile`` of the blocks (the runner's compile switch) with adapters inside
    them: the same losses and adapter values as eager after two steps."""
    from libai.runtime.parallel import ModelRunner

    tiny_hf("llama", tmp_path / "base")
    models = []
    for _ in range(2):
        model = load_huggingface(str(tmp_path / "base"))
        apply_lora(model, LoRAConfig(target_modules=("q_proj", "v_proj", "down_proj"), r=2))
        randomize_ours(model)
        models.append(model)
    runners = [ModelRunner(models[0]), ModelRunner(models[1], compile=True)]
    assert all(layer._compiled_call_impl is not None for layer in models[1].model.layers.values())
    optimizers = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1) for m in models
    ]
    for step in range(2):
        batch = {"input_ids": ids(), "labels": ids()}
        losses = [r.train_step(batch, o) for r, o in zip(runners, optimizers)]
        assert abs(losses[0] - losses[1]) < 1e-5, (step, losses)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        if getattr(a, "libai_lora", False):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_fresh_adapters_start_as_peft_does_and_dropout_acts_in_training(tmp_path):
    """PEFT's start: B zero (the model computes exactly the base), A Kaiming-uniform with
    a = sqrt(5) (uniform in +-1/sqrt(fan_in)). ``lora_dropout`` drops the adapter's input in
    training only."""
    tiny_hf("llama", tmp_path / "base")
    base = load_huggingface(str(tmp_path / "base")).eval()
    model = load_huggingface(str(tmp_path / "base")).eval()
    targets = (*LLAMA_TARGETS, "embed_tokens")
    apply_lora(model, LoRAConfig(target_modules=targets, r=4, lora_dropout=0.5))
    torch.testing.assert_close(ours_logits(model, ids()), ours_logits(base, ids()), atol=0, rtol=0)
    for name, p in model.named_parameters():
        assert p.requires_grad == ("lora_" in name), name  # adapters train, the base is frozen
        if ".lora_embedding_A" in name:  # the embedding's: A zero, B standard normal
            assert not p.any(), name
        elif ".lora_embedding_B" in name:
            assert abs(p.std().item() - 1) < 0.25 and abs(p.mean().item()) < 0.25, name
        elif ".lora_B" in name:
            assert not p.any(), name
        elif ".lora_A" in name:
            bound = 1 / p.shape[1] ** 0.5
            assert p.abs().max() <= bound, name
            assert abs(p.std().item() - bound / 3**0.5) < 0.25 * bound, name
    randomize_ours(model)
    layer = model.model.layers["0"].mlp.dense_4h_to_h
    x = torch.randn(2, 5, 48)
    want = x @ layer.weight.T + layer.lora.scaling * (x @ layer.lora.lora_A.T) @ layer.lora.lora_B.T
    torch.testing.assert_close(layer(x), want, atol=1e-6, rtol=1e-6)  # eval: no dropout
    layer.train()
    torch.manual_seed(0)
    dropped = layer(x)
    assert (dropped - want).abs().max() > 1e-3
    torch.manual_seed(0)
    mask = torch.nn.functional.dropout(torch.ones_like(x), 0.5, training=True)
    kept = (
        x @ layer.weight.T
        + layer.lora.scaling * ((x * mask) @ layer.lora.lora_A.T) @ layer.lora.lora_B.T
    )
    torch.testing.assert_close(dropped, kept, atol=1e-5, rtol=1e-5)
    # the embedding's adapter: table[ids] + scaling * (A^T)[ids] B^T, no dropout (as PEFT)
    embedding = model.model.embed_tokens
    token_ids = ids()
    adapter = embedding.lora
    want = embedding.weight[token_ids] + adapter.scaling * (
        adapter.lora_embedding_A.T[token_ids] @ adapter.lora_embedding_B.T
    )
    for mode in (False, True):
        embedding.train(mode)
        torch.testing.assert_close(embedding(token_ids), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("segments", [None, ("q", "v")])
def test_fp32_adapters_on_a_bf16_layer_outside_autocast(segments):
    """A bf16 base layer with fp32 adapters (O2's layout) called without autocast: the
    adapter's product comes in the base output's dtype and equals the fp32 formula (a whole
    layer; a fused qkv projection's q and v segments in their interleaved rows, k's rows
    untouched), through the layer and through the adapter alone (the server's call)."""
    from libai.layers import Linear
    from libai.layers.lora import LoRA, QKVLayout

    groups, g, d = 2, 2, 4
    torch.manual_seed(0)
    base = Linear(16, groups * (g + 2) * d, bias=False, parallel="col").to(torch.bfloat16)
    if segments is None:
        base.lora = LoRA(base, 4, 8.0)
    else:
        widths = {"q": groups * g * d, "k": groups * d, "v": groups * d}
        qkv = QKVLayout(groups, g, d)
        base.lora = LoRA(base, 4, 8.0, segments=segments, qkv=qkv, full_widths=widths)
    for p in base.lora.parameters():
        torch.nn.init.normal_(p, std=0.5)
    assert all(p.dtype == torch.float32 for p in base.lora.parameters())
    x = torch.randn(3, 5, 16).to(torch.bfloat16)

    def product(name):  # scaling * x A^T B^T in fp32
        a = getattr(base.lora, "lora_A" + name)
        return (x.float() @ a.T * base.lora.scaling) @ getattr(base.lora, "lora_B" + name).T

    if segments is None:
        delta = product("")
    else:  # rows: groups x (g query heads, key, value) x d
        delta = torch.zeros(3, 5, groups, g + 2, d)
        delta[..., :g, :] = product("_q").view(3, 5, groups, g, d)
        delta[..., g + 1, :] = product("_v").view(3, 5, groups, d)
        delta = delta.view(3, 5, -1)
    want = x.float() @ base.weight.float().T + delta
    with torch.no_grad():
        got, alone = base(x), base.lora(x)
    assert got.dtype == alone.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.02)
    torch.testing.assert_close(alone.float(), delta, atol=0.1, rtol=0.02)
