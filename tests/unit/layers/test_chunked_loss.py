"""The chunked LM loss (``loss_chunk_size``, :func:`libai.layers.chunked_lm_loss`) equals the
plain ``ParallelCrossEntropyLoss(LMLogits(hidden))`` in value and in every gradient, saves
far fewer activation bytes, and works under tp2 / pp2 (torchrun) as on one process."""

from __future__ import annotations

import json

import pytest
import torch
from chunked_loss_cases import (
    MODELS,
    REL_TOL,
    build,
    make_batch,
    run_step,
    worst_relative,
)
from launch import torchrun

from libai import dist
from libai.layers import (
    LMLogits,
    ParallelCrossEntropyLoss,
    VocabEmbedding,
    chunked_lm_loss,
    init_method_normal,
)
from libai.models.utils import load_huggingface, save_huggingface
from libai.models.utils.model_loader.gpt_loader import GPT2LoaderHuggerFace
from libai.models.utils.model_loader.llama_loader import LlamaLoaderHuggerFace


@pytest.fixture(autouse=True)
def single_process():
    dist.setup_dist_util({})


def head_case(vocab=99, hidden=32, tokens=(3, 11), bias=True, tied=True, seed=0):
    """An LM head (tied to an embedding, or its own weight; with a bias) and its inputs."""
    torch.manual_seed(seed)
    init = init_method_normal(0.5)  # logits of O(1): a softmax far from uniform
    if tied:
        head = LMLogits(VocabEmbedding(vocab, hidden, init, layer_idx=0), bias=bias, layer_idx=-1)
    else:
        head = LMLogits(None, bias=bias, vocab_size=vocab, hidden_size=hidden, init_method=init)
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    hidden_states = torch.randn(*tokens, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, tokens)
    labels.view(-1)[::4] = -100
    return head, hidden_states, labels


def loss_and_grads(head, hidden, loss_fn) -> dict[str, torch.Tensor]:
    params = [head.tied_weight()] + ([head.bias] if head.bias is not None else [])
    loss = loss_fn()
    grads = torch.autograd.grad(loss, [hidden, *params])
    return {"loss": loss.detach(), "hidden": grads[0], **dict(zip(["weight", "bias"], grads[1:]))}


def plain_loss(head, hidden, labels):
    return lambda: ParallelCrossEntropyLoss()(head(hidden), labels)


# ---- the function ------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 11, 16, 33, 1000])  # 33 tokens: dividing and not
@pytest.mark.parametrize("tied", [True, False])
def test_function_equals_plain_loss_fp32(chunk, tied):
    head, hidden, labels = head_case(tied=tied)
    want = loss_and_grads(head, hidden, plain_loss(head, hidden, labels))
    got = loss_and_grads(head, hidden, lambda: chunked_lm_loss(hidden, head, labels, chunk))
    rel, where = worst_relative(got, want)
    assert rel <= REL_TOL, (where, rel)
    assert got["loss"].dtype == torch.float32 and got["weight"].dtype == torch.float32


def test_function_all_ignored_and_errors():
    head, hidden, labels = head_case()
    labels = torch.full_like(labels, -100)
    got = loss_and_grads(head, hidden, lambda: chunked_lm_loss(hidden, head, labels, 5))
    want = loss_and_grads(head, hidden, plain_loss(head, hidden, labels))
    for key in want:  # nothing to score: loss 0 and zero gradients, as the plain loss
        assert torch.equal(got[key], want[key]) and not got[key].any(), key
    for bad in (0, -1, 2.5, None, True):
        with pytest.raises(ValueError, match="chunk_size|loss_chunk_size"):
            chunked_lm_loss(hidden, head, labels, bad)
    with pytest.raises(ValueError, match="do not match"):
        chunked_lm_loss(hidden, head, labels[:, :-1], 5)


def test_function_bf16_autocast():
    """Under bf16 autocast the head's matmuls run in bf16 as the plain head's do; the softmax
    is fp32 in both; gradients reach the fp32 parameters as fp32."""
    head, hidden, labels = head_case(hidden=64, tokens=(4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_and_grads(head, hidden, plain_loss(head, hidden, labels))
        got = loss_and_grads(head, hidden, lambda: chunked_lm_loss(hidden, head, labels, 10))
    assert got["loss"].dtype == torch.float32
    assert all(got[k].dtype == torch.float32 for k in ("hidden", "weight", "bias"))
    # both round the logits to bf16 (8 bits); d W: one bf16 matmul vs a fp32 sum of chunks
    rel, where = worst_relative(got, want)
    assert rel <= 1e-2, (where, rel)


def saved_bytes(fn, params) -> int:
    """Bytes autograd saves for backward in ``fn()``, counting each storage once and not the
    ``params``' (they, and views of them such as ``W^T``, exist anyway)."""
    storages, skip = {}, {p.untyped_storage().data_ptr() for p in params}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return sum(storages.values())


def test_saved_activation_bytes_far_below_plain():
    """1024 tokens, hidden 64, vocab 8000: the plain loss saves the fp32 log-softmax
    [tokens, vocab] (32 MB); the chunked one the hidden states, the labels and one fp32
    per token (~0.27 MB)."""
    head, hidden, labels = head_case(vocab=8000, hidden=64, tokens=(2, 512), bias=False)
    params = [head.tied_weight()]
    plain = saved_bytes(plain_loss(head, hidden, labels), params)
    chunked = saved_bytes(lambda: chunked_lm_loss(hidden, head, labels, 128), params)
    assert plain >= 1024 * 8000 * 4
    assert chunked <= 1024 * (64 * 4 + 8 + 4) + 1024, chunked  # hidden + labels + lse
    assert plain / chunked > 100, (plain, chunked)


# ---- the models ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [4, 7, 1000])  # 44 tokens: 4 divides, 7 does not
@pytest.mark.parametrize("name", list(MODELS))
def test_model_equals_plain_every_gradient(name, chunk):
    batch = make_batch()
    want = run_step(build(name), name, batch)
    got = run_step(build(name, chunk), name, batch)
    assert set(got["grads"]) == set(want["grads"])
    rel, where = worst_relative(got["grads"], want["grads"])
    assert rel <= REL_TOL, (where, rel)
    assert abs(got["loss"] - want["loss"]) <= REL_TOL * abs(want["loss"])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_model_bf16_autocast(name):
    batch = make_batch()
    want = run_step(build(name), name, batch, amp_dtype=torch.bfloat16)
    got = run_step(build(name, 5), name, batch, amp_dtype=torch.bfloat16)
    rel, where = worst_relative(got["grads"], want["grads"])
    assert rel <= 5e-2, (where, rel)  # bf16 rounding propagated through the blocks
    assert abs(got["loss"] - want["loss"]) <= 1e-2 * abs(want["loss"])


@pytest.mark.parametrize("name", list(MODELS))
def test_model_option_default_and_eval(name):
    """None is today's path bit for bit; with chunking, eval and label-free calls still give
    logits; the option is a recorded hyper-parameter; bad values fail at build."""
    batch = make_batch()
    plain = build(name)
    backbone = plain.GPT_model if name == "gpt2" else plain.model
    assert backbone.libai_cfg["loss_chunk_size"] is None
    if name == "gpt2":
        want = plain.loss_func(plain.GPT_model(batch["input_ids"]), batch["labels"])
    else:
        logits = plain.lm_head(plain.model(batch["input_ids"])["last_hidden_state"])
        want = plain.pipeline_loss(logits, plain.pipeline_target(batch))
    assert torch.equal(plain(**batch)["lm_loss"], want)

    chunked = build(name, 8).eval()
    out = chunked(**batch)
    assert out["logits"].shape == (*batch["labels"].shape, 99)
    assert torch.equal(out["lm_loss"], plain.eval()(**batch)["lm_loss"])
    assert chunked(input_ids=batch["input_ids"])["logits"].shape[-1] == 99
    with pytest.raises(ValueError, match="loss_chunk_size"):
        build(name, 0)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hugging_face_export_ignores_option(name, tmp_path):
    model = build(name, 16)
    save_huggingface(model, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert not any("chunk" in key for key in config), sorted(config)
    loaded = load_huggingface(str(tmp_path), loss_chunk_size=12)
    backbone = loaded.GPT_model if name == "gpt2" else loaded.model
    assert backbone.loss_chunk_size == 12
    loader = GPT2LoaderHuggerFace if name == "gpt2" else LlamaLoaderHuggerFace
    assert loader.hf_config(backbone.libai_cfg, loaded) == loader.hf_config(
        {**backbone.libai_cfg, "loss_chunk_size": None}, loaded
    )


# ---- tp2 / pp2 -------------------------------------------------------------------------------


def test_tp2_pp2_equal_one_process(tmp_path):
    """Single-process references here, the 2-rank runs in ``dist_scripts/chunked_loss_tp.py``
    (tp2 vs the plain loss; pp2 with 2 micro-batches vs one process chunked, fp32 and bf16)."""
    batch = make_batch()
    ref = {"plain": {}, "chunked_mb2": {}}
    for name in MODELS:
        plain = run_step(build(name), name, batch)
        ref["plain"][name] = {"loss": plain["loss"], "grads": plain["grads"]}
        chunked = run_step(build(name, 7), name, batch, microbatches=2)
        bf16 = run_step(build(name, 7), name, batch, microbatches=2, amp_dtype=torch.bfloat16)
        ref["chunked_mb2"][name] = {
            "loss": chunked["loss"],
            "grads": chunked["grads"],
            "loss_bf16": bf16["loss"],
            "bf16": bf16["grads"],
        }
    path = tmp_path / "reference.pt"
    torch.save(ref, path)
    results = torchrun("chunked_loss_tp.py", 2, str(path))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    cases = {}
    for result in results:
        for case in result["cases"]:
            cases.setdefault(case["name"], []).append(case)
    assert len(cases) == 7, sorted(cases)
    for name, items in cases.items():
        assert len(items) == 2, name
        if name.startswith("tp2"):
            assert [i["head_rows"] for i in items] == [50, 50]  # 100 padded rows / tp
            assert all(i["saved_logits"][0] == 0 < i["saved_logits"][1] for i in items)
        else:  # each stage's gradients, together every parameter of the model
            model = name.removeprefix("pp2-").removesuffix("-bf16")
            held = set(items[0]["grad_names"]) | set(items[1]["grad_names"])
            assert held == set(ref["plain"][model]["grads"]), name
            assert all(set(i["grad_names"]) < held for i in items), name  # a stage each
