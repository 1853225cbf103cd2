"""GPT-2 from a Hugging Face directory on 1 process, tp2, pp2 and dp2 x tp2 equals
transformers (logits, loss, every gradient), and exports back bitwise."""

from __future__ import annotations

import hf_parity
import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_parity import check_layouts, check_single_process, hf_reference, save_case

from libai import dist
from libai.models.utils import load_huggingface

VOCAB = 101


@pytest.fixture(scope="module")
def gpt2_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        # away from the defaults: a loader ignoring one fails parity
        layer_norm_epsilon=1e-3,
        n_inner=48,
        activation_function="gelu",
        initializer_range=0.05,
    )
    hf = transformers.GPT2LMHeadModel(config)
    hf.save_pretrained(root / "hf")
    tokens = torch.randint(0, VOCAB, (4, 9))
    x, y = tokens[:, :-1], tokens[:, 1:]
    ref = hf_reference(
        hf,
        {"input_ids": x},
        lambda out: F.cross_entropy(out.logits.reshape(-1, VOCAB), y.reshape(-1)),
        {"logits": lambda out: out.logits},
    )
    case = save_case(
        root / "case.pt", batch={"input_ids": x, "labels": y}, input_keys=["input_ids"], ref=ref
    )
    return root, case, hf.state_dict()


def test_single_process(gpt2_case):
    root, case, state = gpt2_case
    check_single_process(
        case, str(root / "hf"), {"export_dir": str(root / "out1"), "max_shard_size": 20_000}
    )
    assert (root / "out1" / "model.safetensors.index.json").exists()
    hf_parity.assert_exported(
        root / "out1", transformers.GPT2LMHeadModel, state, source=root / "hf"
    )


def test_tp2_and_pp2(gpt2_case):
    root, case, state = gpt2_case
    layouts = [hf_parity.tp2_layout(root), hf_parity.pp2_layout(root)]
    check_layouts(case, str(root / "hf"), 2, layouts)
    hf_parity.assert_exported(root / "tp2", transformers.GPT2LMHeadModel, state, source=root / "hf")
    hf_parity.assert_exported(root / "pp2", transformers.GPT2LMHeadModel, state, source=root / "hf")


def test_dp2_tp2_and_tp2_pp2(gpt2_case):
    root, case, state = gpt2_case
    layouts = [
        hf_parity.dp2_tp2_layout(root),
        {
            "name": "tp2xpp2",
            "dist": {
                "tensor_parallel_size": 2,
                "pipeline_parallel_size": 2,
                "pipeline_num_layers": 2,
            },
            "microbatches": 2,
            "export_dir": str(root / "tp2pp2"),
        },
    ]
    check_layouts(case, str(root / "hf"), 4, layouts)
    hf_parity.assert_exported(
        root / "dp2tp2", transformers.GPT2LMHeadModel, state, source=root / "hf"
    )
    hf_parity.assert_exported(
        root / "tp2pp2", transformers.GPT2LMHeadModel, state, source=root / "hf"
    )


def test_kv_cache_without_position_ids_continues_the_positions(gpt2_case):
    """GPTModel with a KV cache and no position_ids (a caller that leaves positions to the
    model): each cached step takes the positions after the cached ones, so the steps'
    logits equal one forward over the whole sequence, which equals transformers."""
    root, _, _ = gpt2_case
    dist.setup_dist_util({})
    model = load_huggingface(str(root / "hf")).eval()
    gpt = model.GPT_model
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = gpt.lm_head.gather(gpt(ids))
        logits, past = gpt(ids[:, :4], use_cache=True)
        steps = [gpt.lm_head.gather(logits)]
        for t in range(4, 9):
            logits, past = gpt(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            steps.append(gpt.lm_head.gather(logits))
        hf = transformers.GPT2LMHeadModel.from_pretrained(root / "hf").eval()
        want = hf(ids).logits
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(full, want, atol=1e-5, rtol=0)
