"""T5 (v1.0: relu, tied head) and mT5 (gated-gelu, untied head) from Hugging Face
directories equal transformers on 1 process, tp2, pp2 (three splits) and dp2 x tp2 (logits,
loss, every gradient), export back bitwise, and decode step by step with a KV cache."""

from __future__ import annotations

import json
import shutil

import hf_parity
import pytest
import torch
import transformers
from hf_parity import TOL, check_layouts, check_single_process, hf_reference, save_case

from libai import dist
from libai.layers import relative_position_bucket
from libai.models import T5ForPreTraining, T5Model
from libai.models.utils import CheckpointError, load_huggingface, save_huggingface

VOCAB = 99  # not a multiple of 2: tp2 pads the vocabulary
COMMON = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=48,
    num_layers=2,
    num_heads=4,
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    decoder_start_token_id=0,
    layer_norm_epsilon=1e-3,  # away from the default: a loader ignoring it fails parity
)
PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": 4}
PP_LAYOUTS = [  # layers: encoder 0, 1 then decoder 2, 3
    {"name": "pp2-boundary", "dist": PP, "microbatches": 2},
    # stage 1 = last encoder layer + the whole decoder
    {
        "name": "pp2-0111",
        "dist": {**PP, "custom_pipeline_stage_id": [0, 1, 1, 1]},
        "microbatches": 2,
    },
    # stage 0 = the whole encoder + the first decoder layer
    {
        "name": "pp2-0001",
        "dist": {**PP, "custom_pipeline_stage_id": [0, 0, 0, 1]},
        "microbatches": 2,
    },
]


def build_hf(kind: str):
    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(feed_forward_proj="relu", **COMMON)
        return transformers.T5ForConditionalGeneration(config)
    config = transformers.MT5Config(feed_forward_proj="gated-gelu", **COMMON)
    hf = transformers.MT5ForConditionalGeneration(config)
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32))  # untied, as mT5 releases
    return hf


def make_batch():
    """Right-padded encoder / decoder rows with padding masks, and a loss mask."""
    g = torch.Generator().manual_seed(1)
    enc = torch.randint(2, VOCAB, (4, 7), generator=g)
    dec = torch.randint(2, VOCAB, (4, 5), generator=g)
    labels = torch.randint(2, VOCAB, (4, 5), generator=g)
    enc_mask = torch.ones(4, 7, dtype=torch.long)
    enc_mask[1, 5:] = 0
    enc_mask[3, 4:] = 0
    dec_mask = torch.ones(4, 5, dtype=torch.long)
    dec_mask[1, 3:] = 0
    dec_mask[3, 3:] = 0
    # rows 0 and 2 leave two real positions out of the loss through loss_mask, so every row
    # (hence every dp rank and micro-batch) has 3 labels: means of means equal the mean
    loss_mask = dec_mask.clone()
    loss_mask[0, 1:3] = 0
    loss_mask[2, 2:4] = 0
    return {
        "encoder_input_ids": enc.masked_fill(enc_mask == 0, 0),
        "decoder_input_ids": dec.masked_fill(dec_mask == 0, 0),
        "encoder_attn_mask": enc_mask,
        "decoder_attn_mask": dec_mask,
        "lm_labels": labels.masked_fill(dec_mask == 0, -100),
        "loss_mask": loss_mask,
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = {}
    for kind in ("t5", "mt5"):
        root = tmp_path_factory.mktemp(f"hf_{kind}")
        build_hf(kind).save_pretrained(root / "hf")
        hf = type(build_hf(kind)).from_pretrained(root / "hf")  # as transformers reads it
        assert (hf.lm_head.weight is hf.shared.weight) == (kind == "t5")
        batch = make_batch()
        hf_inputs = {
            "input_ids": batch["encoder_input_ids"],
            "attention_mask": batch["encoder_attn_mask"],
            "decoder_input_ids": batch["decoder_input_ids"],
            "decoder_attention_mask": batch["decoder_attn_mask"],
            "labels": batch["lm_labels"].masked_fill(batch["loss_mask"] == 0, -100),
        }
        ref = hf_reference(
            hf,
            hf_inputs,
            lambda o: o.loss,
            {
                "logits": lambda o: o.logits,
                "encoder_last_hidden_state": lambda o: o.encoder_last_hidden_state,
            },
        )
        keys = ["encoder_input_ids", "decoder_input_ids", "encoder_attn_mask", "decoder_attn_mask"]
        case = save_case(root / "case.pt", batch=batch, input_keys=keys, ref=ref)
        out[kind] = (root, case, hf)
    return out


def assert_exported(path, hf) -> None:
    got = type(hf).from_pretrained(path)
    want = hf.state_dict()
    assert set(got.state_dict()) == set(want)
    for name, value in got.state_dict().items():
        assert torch.equal(value, want[name]), name
    assert (got.lm_head.weight is got.shared.weight) == (hf.lm_head.weight is hf.shared.weight)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [type(hf).__name__]
    assert config["model_type"] == hf.config.model_type
    hf_parity.assert_same_config(path, path.parent / "hf")


@pytest.mark.parametrize("kind", ["t5", "mt5"])
def test_single_process_equals_transformers_and_exports_bitwise(cases, kind):
    root, case, hf = cases[kind]
    check_single_process(
        case, str(root / "hf"), {"export_dir": str(root / "out1"), "max_shard_size": 20_000}
    )
    assert (root / "out1" / "model.safetensors.index.json").exists()
    assert_exported(root / "out1", hf)


def test_t5_tp2_and_three_pp2_splits(cases):
    """v1.0 (tied head: its copy on the last stage) on tp2 and on each kind of pp2 split."""
    root, case, hf = cases["t5"]
    layouts = [hf_parity.tp2_layout(root), *PP_LAYOUTS]
    layouts[2] = {**layouts[2], "export_dir": str(root / "pp2")}  # the mid-encoder split
    results = check_layouts(case, str(root / "hf"), 2, layouts)
    assert set(results) == {layout["name"] for layout in layouts}
    assert_exported(root / "tp2", hf)
    assert_exported(root / "pp2", hf)


def test_mt5_dp2_tp2_and_dp2_pp2(cases):
    """mT5 (gated MLP, untied vocab-split head) on dp2 x tp2 and dp2 x pp2 (one launch)."""
    root, case, hf = cases["mt5"]
    layouts = [
        hf_parity.dp2_tp2_layout(root),
        {
            "name": "dp2xpp2-0001",
            "dist": {**PP, "data_parallel_size": 2, "custom_pipeline_stage_id": [0, 0, 0, 1]},
            "microbatches": 2,
            "export_dir": str(root / "dp2pp2"),
        },
    ]
    check_layouts(case, str(root / "hf"), 4, layouts)
    assert_exported(root / "dp2tp2", hf)
    assert_exported(root / "dp2pp2", hf)


@pytest.fixture
def single_process():
    dist.setup_dist_util({})


def test_base_model_equals_transformers_t5model(cases, single_process, tmp_path):
    root, _, _ = cases["t5"]
    batch = make_batch()
    hf = transformers.T5Model.from_pretrained(root / "hf").eval()
    model = load_huggingface(str(root / "hf"), T5Model).eval()
    with torch.no_grad():
        want = hf(
            input_ids=batch["encoder_input_ids"],
            attention_mask=batch["encoder_attn_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            decoder_attention_mask=batch["decoder_attn_mask"],
        )
        got = model(**{k: batch[k] for k in list(batch)[:4]})
    for key in ("last_hidden_state", "encoder_last_hidden_state"):
        assert (got[key] - getattr(want, key)).abs().max() < TOL, key
    save_huggingface(model, str(tmp_path / "base"))
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    assert config["architectures"] == ["T5Model"] and config["model_type"] == "t5"
    reloaded = transformers.T5Model.from_pretrained(tmp_path / "base").state_dict()
    for name, value in hf.state_dict().items():
        assert torch.equal(reloaded[name], value), name


@pytest.mark.parametrize("kind", ["t5", "mt5"])
def test_greedy_decoding_with_kv_cache_equals_full_forward(cases, single_process, kind):
    root, _, hf = cases[kind]
    model = load_huggingface(str(root / "hf")).eval()
    batch = make_batch()
    enc_ids, enc_mask = batch["encoder_input_ids"], batch["encoder_attn_mask"]
    with torch.no_grad():
        encoder_states = model.t5_model.encode(enc_ids, enc_mask)
        tokens = torch.zeros(4, 1, dtype=torch.long)  # decoder_start_token_id
        past, step_logits = None, []
        for _ in range(6):
            out = model(
                decoder_input_ids=tokens[:, -1:],
                encoder_attn_mask=enc_mask,
                decoder_attn_mask=torch.ones_like(tokens),
                encoder_states=encoder_states,
                past_key_values=past,
                use_cache=True,
            )
            past = out["past_key_values"]
            step_logits.append(out["logits"][:, -1])
            tokens = torch.cat([tokens, out["logits"][:, -1].argmax(-1, keepdim=True)], dim=1)
        cached = torch.stack(step_logits, dim=1)
        # the self-attention cache grew one position a step; the cross cache stayed
        assert past[0][0][0].shape[2] == 6 and past[0][1][0].shape[2] == enc_ids.shape[1]
        decoder_ids = tokens[:, :-1]
        full = model(
            encoder_input_ids=enc_ids, decoder_input_ids=decoder_ids, encoder_attn_mask=enc_mask
        )["logits"]
        want = hf.eval()(
            input_ids=enc_ids, attention_mask=enc_mask, decoder_input_ids=decoder_ids
        ).logits
    assert (cached - full).abs().max() < TOL
    assert (full - want).abs().max() < TOL
    assert torch.equal(cached.argmax(-1), want.argmax(-1))


def test_relative_position_buckets_equal_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 300)[None, :] - torch.arange(0, 40)[:, None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16)):
            want = T5Attention._relative_position_bucket(rel, bidirectional, buckets, distance)
            got = relative_position_bucket(rel, bidirectional, buckets, distance)
            assert torch.equal(got, want), (bidirectional, buckets, distance)


def test_init_follows_t5(single_process):
    torch.manual_seed(0)
    d, heads, head_size, ffn = 64, 4, 32, 256
    model = T5ForPreTraining(
        vocab_size=500,
        hidden_size=d,
        hidden_layers=1,
        num_attention_heads=heads,
        head_size=head_size,
        ffn_hidden_size=ffn,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    layer = model.t5_model.decoder.layers["0"]
    qkv = layer.self_attention.query_key_value.weight.view(heads, 3, head_size, d)
    stds = {
        "q": (qkv[:, 0].std(), (d * head_size) ** -0.5),
        "k": (qkv[:, 1].std(), d**-0.5),
        "cross q": (layer.cross_attention.query.weight.std(), (d * head_size) ** -0.5),
        "o": (layer.self_attention.dense.weight.std(), (heads * head_size) ** -0.5),
        "wi_0": (layer.mlp.dense_gate.weight.std(), d**-0.5),
        "wo": (layer.mlp.dense_4h_to_h.weight.std(), ffn**-0.5),
        "shared": (model.t5_model.word_embeddings.weight.std(), 1.0),
        "lm_head": (model.lm_head.weight.std(), 1.0),
    }
    for name, (got, want) in stds.items():
        assert abs(got.item() / want - 1) < 0.1, (name, got.item(), want)
    assert model.output_scale is None  # untied: no rescaling of the decoder output


def test_bad_input_is_a_clear_error(cases, single_process, tmp_path, monkeypatch):
    root, _, _ = cases["t5"]
    # a checkpoint whose tensors contradict config.json
    bad = tmp_path / "bad"
    shutil.copytree(root / "hf", bad)
    config = json.loads((bad / "config.json").read_text())
    config["d_ff"] = 64
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"contradict config\.json.*DenseReluDense\.wi"):
        load_huggingface(str(bad))
    # an activation libai cannot run
    with pytest.raises(ValueError, match="feed_forward_proj='gated-tanh'"):
        T5Model(
            vocab_size=10,
            hidden_size=8,
            hidden_layers=1,
            num_attention_heads=2,
            ffn_hidden_size=8,
            feed_forward_proj="gated-tanh",
        )
    # tp that does not divide the heads: raised before any parameter exists
    monkeypatch.setattr(dist, "get_tensor_parallel_size", lambda: 3)
    with pytest.raises(
        ValueError, match=r"num_attention_heads=4 is not divisible by tensor_parallel_size=3"
    ):
        T5Model(
            vocab_size=10, hidden_size=12, hidden_layers=1, num_attention_heads=4, ffn_hidden_size=8
        )
    with pytest.raises(
        ValueError,
        match=r"num_attention_heads=4 \(from .*config\.json\) is not divisible by tensor_parallel_size=3",
    ):
        load_huggingface(str(root / "hf"))
