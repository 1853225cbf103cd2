"""ONNX export (libai.onnx_export, tools/export_onnx.py): onnxruntime parity for GPT-2, BERT,
T5 and Llama (GQA) with and without past, greedy generation through onnxruntime, unsupported
models, and a tp2-trained checkpoint exported from one process.

Exports are slow (seconds per graph): each model is exported once per module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

onnxruntime = pytest.importorskip("onnxruntime")

from libai.onnx_export import (  # noqa: E402
    OrtStepper,
    UnsupportedModelError,
    export_onnx,
    graph_paths,
    load_hf_model,
    load_model,
    model_family,
    verify_graph,
    verify_onnx,
)
from libai.onnx_export.wrappers import CausalLMGraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
VOCAB = 100
TOL = 1e-4


def build_hf(name: str):
    """A tiny random transformers model (2 layers, hidden 32)."""
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        config.embd_pdrop = config.attn_pdrop = config.resid_pdrop = 0.0
        return transformers.GPT2LMHeadModel(config)
    if name in ("llama", "qwen2", "mixtral", "olmoe"):  # grouped-query attention: 2 kv heads
        shapes = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
        if name == "qwen2":  # the Llama class with q/k/v biases
            return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shapes))
        if name == "mixtral":  # Mixture-of-Experts blocks: exported computing every expert
            config = transformers.MixtralConfig(
                **shapes, num_local_experts=4, num_experts_per_tok=2
            )
            return transformers.MixtralForCausalLM(config)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shapes))
    if name == "bert":
        config = transformers.BertConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return transformers.BertForPreTraining(config)
    config = transformers.T5Config(
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        vocab_size=VOCAB,
        dropout_rate=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    return transformers.T5ForConditionalGeneration(config)


class Exports:
    """Builds, saves, loads and exports (with past) each tiny model once."""

    def __init__(self, root: Path):
        self.root, self.cache = root, {}

    def __call__(self, name: str):
        if name not in self.cache:
            hf = build_hf(name).eval()
            hf.save_pretrained(self.root / name / "hf")
            model = load_hf_model(self.root / name / "hf").eval()
            specs = export_onnx(model, self.root / name / "onnx" / "model.onnx", with_past=True)
            self.cache[name] = (hf, model, specs)
        return self.cache[name]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return Exports(tmp_path_factory.mktemp("onnx"))


def _io(path) -> tuple[dict, dict]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return (
        {i.name: i.shape for i in session.get_inputs()},
        {o.name: o.shape for o in session.get_outputs()},
    )


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "mixtral", "olmoe"])
def test_decoder_only_parity_and_layout(exports, name):
    _, _, specs = exports(name)
    diffs = verify_onnx(specs)  # fresh batch / sequence sizes, left-padded masks, 1-token steps
    print(name, diffs)
    assert list(diffs) == ["model.onnx", "model_with_past.onnx"]
    assert max(c.max_abs_diff for c in diffs.values()) < TOL, diffs
    assert all(c.ok() for c in diffs.values())
    inputs, outputs = _io(specs[0].path)
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert outputs["logits"] == ["batch_size", "sequence_length", VOCAB]
    kv_heads = 4 if name == "gpt2" else 2
    assert outputs["present.1.value"] == ["batch_size", kv_heads, "sequence_length", 8]
    inputs, outputs = _io(specs[1].path)
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["past_key_values.0.key"] == ["batch_size", kv_heads, "past_sequence_length", 8]
    assert len(inputs) == 3 + 4 and len(outputs) == 1 + 4
    assert set(outputs["present.0.key"]) >= {"batch_size", kv_heads, 8}


def test_axis_renaming_keeps_the_weights_the_exporter_wrote_outside(exports):
    """The exporter writes the large initializers to ``model.onnx.data``; renaming the
    symbolic axes afterwards rewrites ``model.onnx`` but must leave those weights outside it
    (a graph over 2 GB cannot be saved inline: protobuf's limit). Checked with onnx's own
    external-data helper, and the data file holds at least the bytes of those tensors."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    _, _, specs = exports("gpt2")
    path = specs[0].path
    proto = onnx.load(str(path), load_external_data=False)
    external = [t for t in proto.graph.initializer if uses_external_data(t)]
    assert external, "no initializer left in external data"
    sizes = [int({e.key: e.value for e in t.external_data}["length"]) for t in external]
    assert path.with_name(path.name + ".data").stat().st_size >= sum(sizes)


def test_bert_parity(exports):
    hf, _, specs = exports("bert")
    diffs = verify_onnx(specs)
    print("bert", diffs)
    assert max(c.max_abs_diff for c in diffs.values()) < TOL, diffs
    assert all(c.ok() for c in diffs.values())
    inputs, outputs = _io(specs[0].path)
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    assert outputs["prediction_logits"] == ["batch_size", "sequence_length", VOCAB]
    # and the graph agrees with transformers on a right-padded batch
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(9))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    types = torch.zeros_like(ids)
    session = onnxruntime.InferenceSession(str(specs[0].path))
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types}
    feed["token_type_ids"] = types.numpy()
    got = session.run(["prediction_logits"], feed)[0]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).prediction_logits
    assert (torch.from_numpy(got) - want).abs().max() < TOL


def test_t5_parity_and_layout(exports):
    _, _, specs = exports("t5")
    diffs = verify_onnx(specs)
    print("t5", diffs)
    assert list(diffs) == [
        "encoder_model.onnx",
        "decoder_model.onnx",
        "decoder_with_past_model.onnx",
    ]
    assert max(c.max_abs_diff for c in diffs.values()) < TOL, diffs
    assert all(c.ok() for c in diffs.values())
    inputs, _ = _io(specs[1].path)
    assert list(inputs) == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    inputs, outputs = _io(specs[2].path)
    assert inputs["past_key_values.1.encoder.value"] == [
        "batch_size",
        4,
        "encoder_sequence_length",
        8,
    ]
    assert list(outputs) == ["logits"] + [
        f"present.{i}.decoder.{kv}" for i in range(2) for kv in ("key", "value")
    ]


def test_verification_catches_a_wrong_graph(exports):
    _, model, specs = exports("gpt2")
    weight = model.GPT_model.transformer.layers["0"].mlp.dense_h_to_4h.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(2.0)  # the torch model changes after the export: verification must see it
        try:
            check = verify_graph(specs[0])
            assert check.max_abs_diff > 100 * TOL and not check.ok()
        finally:
            weight.copy_(saved)


# ---- generation -------------------------------------------------------------------------------
def _greedy_loop(stepper, input_ids, attention_mask, n: int, start=None) -> torch.Tensor:
    """The new tokens of a minimal greedy loop over the stepper protocol."""
    stepper.start(input_ids, attention_mask, 1, input_ids.shape[1] + n)
    seq = input_ids if start is None else torch.full((len(input_ids), 1), start)
    mask = attention_mask if start is None else torch.ones_like(seq)
    for _ in range(n):
        token = stepper.next_logits(seq, mask).argmax(-1, keepdim=True)
        seq, mask = torch.cat([seq, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
    return seq[:, -n:]


def _generate(stepper, input_ids, attention_mask, n: int, start=None) -> torch.Tensor | None:
    """The new tokens of ``libai.inference.generation.generate`` (None where it is absent)."""
    try:
        from libai.inference.generation import generate
    except ImportError:
        return None
    extra = {} if start is None else {"decoder_start_token_id": start}
    out = generate(stepper, input_ids, attention_mask, max_new_tokens=n, do_sample=False, **extra)
    return out[:, -n:]


def _prompts():
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _transformers_greedy(hf, ids, mask, n: int, name: str) -> torch.Tensor:
    """The ``n`` new tokens of transformers' greedy ``generate`` (no early eos)."""
    hf.generation_config.eos_token_id = None  # decode exactly n tokens
    hf.generation_config.pad_token_id = 0
    hf.generation_config.decoder_start_token_id = 0 if name == "t5" else None
    with torch.no_grad():
        return hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False
        )[:, -n:]


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "mixtral"])
def test_ort_greedy_generation_matches_transformers(exports, name):
    hf, _, specs = exports(name)
    ids, mask = _prompts()
    n = 8
    want = _transformers_greedy(hf, ids, mask, n, name)
    output = specs[0].path.with_name("model.onnx")
    stepper = OrtStepper(output)
    assert stepper.is_encoder_decoder == (name == "t5") and stepper.with_past is not None
    start = 0 if name == "t5" else None
    got = _greedy_loop(stepper, ids, mask, n, start)
    assert torch.equal(got, want), (got, want)
    got = _generate(stepper, ids, mask, n, start)
    assert got is None or torch.equal(got, want), (got, want)
    # beam reordering keeps rows consistent: reversing the cache rows and the batch agrees
    stepper.start(ids, mask, 1, ids.shape[1] + 2)
    seq = torch.full((3, 1), start) if start is not None else ids
    step_mask = torch.ones_like(seq) if start is not None else mask
    first = stepper.next_logits(seq, step_mask)
    token = first.argmax(-1, keepdim=True)
    rev = torch.tensor([2, 1, 0])
    stepper.reorder(rev)
    seq, step_mask = torch.cat([seq, token], 1)[rev], torch.cat([step_mask, token * 0 + 1], 1)[rev]
    second = stepper.next_logits(seq, step_mask)
    assert torch.equal(second.argmax(-1), want[rev, 1])
    # from the second step on the with-past graph reads only the tokens after the cache: a
    # prefix the cache already holds, overwritten here, is not read again, so the next token
    # is still transformers' (a stepper recomputing the whole sequence reads the zeros)
    token = second.argmax(-1, keepdim=True)
    seq, step_mask = torch.cat([seq, token], 1), torch.cat([step_mask, token * 0 + 1], 1)
    third = stepper.next_logits(torch.cat([torch.zeros_like(seq[:, :-1]), token], 1), step_mask)
    assert torch.equal(third.argmax(-1), want[rev, 2])


def test_stepper_ignores_a_with_past_graph_the_first_graph_cannot_feed(exports, tmp_path):
    """A ``model_with_past.onnx`` left in the folder by an earlier ``--with-past`` export
    (an export never deletes files it did not write), next to a graph exported without past,
    so without presents: nothing can fill the cache, so the stepper runs the first graph at
    every step, and the tokens are still transformers'."""
    hf, model, specs = exports("gpt2")
    out = tmp_path / "model.onnx"
    export_onnx(model, out, with_past=False)
    stale = specs[1].path
    for path in stale.parent.glob(stale.name + "*"):  # the graph and its external data
        shutil.copy(path, tmp_path / path.name)
    assert graph_paths(out, "causal_lm", with_past=True)[1].is_file()
    stepper = OrtStepper(out)
    ids, mask = _prompts()
    got = _greedy_loop(stepper, ids, mask, 4)
    assert torch.equal(got, _transformers_greedy(hf, ids, mask, 4, "gpt2"))


def test_stepper_opens_every_graph_with_the_providers_and_options_given(exports):
    """Every session (T5's encoder, decoder and with-past decoder) runs on the execution
    providers and session options the caller gives, and on the CPU provider by default."""
    _, _, specs = exports("t5")
    output = specs[0].path.with_name("model.onnx")

    def sessions(**kwargs):
        stepper = OrtStepper(output, **kwargs)
        return [stepper.encoder, stepper.decoder, stepper.with_past]

    assert [s.get_providers() for s in sessions()] == [["CPUExecutionProvider"]] * 3
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    threads = [
        s.get_session_options().intra_op_num_threads for s in sessions(session_options=options)
    ]
    assert threads == [1] * 3
    other = [p for p in onnxruntime.get_available_providers() if p != "CPUExecutionProvider"]
    if not other:
        pytest.skip("this onnxruntime build has no provider but the CPU's")
    providers = [other[0], "CPUExecutionProvider"]
    assert [s.get_providers() for s in sessions(providers=providers)] == [providers] * 3


def test_causal_lm_graph_defaults_to_logits_only(exports):
    """``CausalLMGraph(model)``, its documented defaults: no past inputs and no presents,
    so one output, transformers' logits (on the tokens the mask keeps)."""
    hf, model, _ = exports("gpt2")
    ids, mask = _prompts()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = CausalLMGraph(model)(ids, mask, position_ids)
        want = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    assert len(out) == 1
    assert (out[0] - want)[mask.bool()].abs().max() < TOL


def test_axes_of_one_size_carry_one_name(exports):
    """Axes that always have the same size carry the same name, so onnxruntime (and anyone
    reading the graph) knows they are equal: axis 0 of every input and output of every graph
    is ``batch_size``; in the graphs without past the mask, the position ids, the token
    types and the logits span the tokens of ``input_ids``; T5's encoder mask and states
    span the encoder's tokens."""
    for name in ("gpt2", "llama", "bert", "t5"):
        for spec in exports(name)[2]:
            inputs, outputs = _io(spec.path)
            for value, shape in {**inputs, **outputs}.items():
                assert shape[0] == "batch_size", (spec.path.name, value, shape)
    for name in ("gpt2", "llama", "bert"):
        inputs, outputs = _io(exports(name)[2][0].path)
        spans = [shape[1] for value, shape in inputs.items()]
        # the logits over tokens (BERT's seq_relationship_logits are [batch, 2])
        spans += [shape[1] for value, shape in outputs.items() if len(shape) == 3]
        assert set(spans) == {inputs["input_ids"][1]}, (name, inputs, outputs)
    encoder, decoder, with_past = (_io(spec.path)[0] for spec in exports("t5")[2])
    assert encoder["attention_mask"][1] == encoder["input_ids"][1] == "encoder_sequence_length"
    for inputs in (decoder, with_past):
        assert inputs["encoder_attention_mask"][1] == "encoder_sequence_length"
    assert decoder["encoder_hidden_states"][1] == "encoder_sequence_length"


# ---- errors -----------------------------------------------------------------------------------
def test_unsupported_models_raise_clear_errors(tmp_path):
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=8,
        patch_size=4,
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    with pytest.raises(UnsupportedModelError, match="model_type 'vit' is not supported"):
        load_model(tmp_path / "vit")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(UnsupportedModelError, match="'mamba'.*supported: gpt2, bert"):
        load_model(tmp_path / "odd")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    from libai import dist
    from libai.models import VisionTransformer

    dist.setup_dist_util({})
    vit = VisionTransformer(
        img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3
    )
    with pytest.raises(UnsupportedModelError, match="does not support VisionTransformer"):
        model_family(vit)
    with pytest.raises(UnsupportedModelError):
        export_onnx(vit, tmp_path / "vit.onnx")
    # DeepSeek-V3's latent attention: named, before any tracing
    from libai.models import LlamaForCausalLM

    latent = dict(kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6)
    deepseek = LlamaForCausalLM(
        hidden_layers=1,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        model_type="deepseek_v3",
        latent_attention=latent,
    )
    with pytest.raises(UnsupportedModelError, match="latent attention .* has no ONNX export"):
        export_onnx(deepseek, tmp_path / "deepseek.onnx")


# ---- a tp2-trained checkpoint through the command line -------------------------------------------
TINY_GPT_OPTS = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=4",
    "model.cfg.ffn_hidden_size=64",
    "model.cfg.max_seq_length=32",
]


def test_tp2_checkpoint_exports_from_one_process(tmp_path):
    from launch import torchrun

    ckpt = tmp_path / "run"
    # the trainer sets vocab_size from the tokenizer (not in the config file): 96 here
    results = torchrun(
        "onnx_checkpoint.py", 2, str(ckpt), *TINY_GPT_OPTS, "model.cfg.vocab_size=96"
    )
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        assert r["embedding_shard"] == [48, 32]  # vocab-split over tp2
    out = tmp_path / "onnx" / "gpt.onnx"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "export_onnx.py"),
        "--model-path",
        str(ckpt),  # the output dir: last_checkpoint -> model_final
        "--config-file",
        str(ROOT / "configs" / "gpt2_pretrain.py"),
        "--output",
        str(out),
        *TINY_GPT_OPTS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "onnxruntime vs PyTorch  gpt.onnx: max abs diff" in proc.stdout
    assert "vocab_size 96 in the checkpoint" in proc.stderr
    assert not out.with_name("gpt_with_past.onnx").exists()
    # the single-file graph reproduces the logits the tp2 model computed
    ref = torch.load(ckpt / "reference.pt")
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits"]
    feed = {k: ref[k].numpy() for k in ("input_ids", "attention_mask", "position_ids")}
    (logits,) = session.run(["logits"], feed)
    diff = (torch.from_numpy(logits) - ref["logits"]).abs().max().item()
    print("tp2 checkpoint vs onnxruntime", diff)
    assert diff < TOL
    # bad input through the command line: a clear error and exit status 2
    bad = subprocess.run(
        [*cmd[:3], str(tmp_path / "nowhere"), *cmd[4:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "error: FileNotFoundError" in bad.stderr, bad.stderr[-2000:]


def test_cli_exits_nonzero_beyond_the_tolerance(exports, tmp_path, capsys):
    import importlib.util

    exports("gpt2")  # builds the Hugging Face directory
    spec = importlib.util.spec_from_file_location("export_onnx", ROOT / "tools" / "export_onnx.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    args = ["--model-path", str(exports.root / "gpt2" / "hf"), "--output", str(tmp_path / "m.onnx")]
    assert cli.main([*args, "--atol", "0", "--rtol", "0"]) == 1  # no float graph is that exact
    captured = capsys.readouterr()
    assert "m.onnx: max abs diff" in captured.out and "beyond the tolerance" in captured.err
