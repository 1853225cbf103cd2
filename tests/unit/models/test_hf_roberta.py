"""RoBERTa from a Hugging Face directory equals transformers (outputs, loss, every gradient):
RobertaForMaskedLM on 1 process, tp2 and pp2; RobertaForCausalLM on 1 process and dp2 x tp2;
RobertaModel; every layout exports back bitwise."""

from __future__ import annotations

import hf_parity
import pytest
import torch
import transformers
from hf_parity import check_layouts, check_single_process, hf_reference, save_case

from libai import dist
from libai.models import RobertaForCausalLM, RobertaForPreTraining, RobertaModel
from libai.models.roberta_model import create_position_ids_from_input_ids
from libai.models.utils import load_huggingface

VOCAB, SEQ, BATCH, PAD = 97, 10, 4, 1
LENGTHS = (10, 7, 10, 8)  # real tokens per row, then padding (id 1)


def tiny_config(**kw):
    return transformers.RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ + 2,  # positions run pad+1 .. pad+SEQ
        type_vocab_size=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-3,  # away from the defaults: a loader ignoring it fails parity
        **kw,
    )


def make_batch(seed: int, predicted: int, skip: int):
    """Right-padded rows, ``predicted`` labelled tokens per row among the real ones at index
    >= ``skip`` (equal counts per row keep every row subset's mean loss exact); one pad
    token inside row 0 is attended (it takes the padding position, like transformers)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    ids[:, 0] = 0  # <s>
    mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    labels = torch.full((BATCH, SEQ), -100)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        ids[row, n:] = PAD
        picked = skip + torch.randperm(n - skip, generator=g)[:predicted]
        labels[row, picked] = torch.randint(3, VOCAB, (predicted,), generator=g)
    ids[0, 4] = PAD
    return ids, mask, labels


@pytest.fixture(scope="module")
def mlm_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_roberta_mlm")
    torch.manual_seed(0)
    hf = transformers.RobertaForMaskedLM(tiny_config())
    hf.save_pretrained(root / "hf")
    ids, mask, labels = make_batch(0, predicted=3, skip=1)
    ref = hf_reference(
        hf,
        {"input_ids": ids, "attention_mask": mask, "labels": labels},
        lambda out: out.loss,
        {"logits": lambda out: out.logits},
    )
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        tokentype_ids=torch.zeros_like(ids),
        lm_labels=labels,
        loss_mask=(labels != -100).long(),
    )
    case = save_case(
        root / "case.pt", batch=batch, input_keys=["input_ids", "attention_mask"], ref=ref
    )
    return root, case, hf.state_dict()


@pytest.fixture(scope="module")
def causal_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_roberta_clm")
    torch.manual_seed(1)
    hf = transformers.RobertaForCausalLM(tiny_config(is_decoder=True))
    hf.save_pretrained(root / "hf")
    # unshifted labels: only the last 4 real tokens of each row are targets
    ids, mask, _ = make_batch(1, predicted=0, skip=1)
    labels = torch.full_like(ids, -100)
    for row, n in enumerate(LENGTHS):
        labels[row, n - 4 : n] = ids[row, n - 4 : n]
    ref = hf_reference(
        hf,
        {"input_ids": ids, "attention_mask": mask, "labels": labels},
        lambda out: out.loss,
        {"logits": lambda out: out.logits},
    )
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels)
    case = save_case(
        root / "case.pt", batch=batch, input_keys=["input_ids", "attention_mask"], ref=ref
    )
    return root, case, hf.state_dict()


def test_position_ids_skip_padding():
    ids = torch.tensor([[0, 5, 1, 6, 2, 1, 1]])
    want = transformers.models.roberta.modeling_roberta.RobertaEmbeddings
    want = want.create_position_ids_from_input_ids(ids, PAD)
    assert torch.equal(create_position_ids_from_input_ids(ids, PAD), want)
    assert want.tolist() == [[2, 3, 1, 4, 5, 1, 1]]


def test_masked_lm_single_process(mlm_case):
    root, case, state = mlm_case
    result = check_single_process(case, str(root / "hf"), {"export_dir": str(root / "out1")})
    assert "out_logits" in result and result["grads_checked"] >= 30
    hf_parity.assert_exported(
        root / "out1", transformers.RobertaForMaskedLM, state, source=root / "hf"
    )


def test_masked_lm_tp2_and_pp2(mlm_case):
    root, case, state = mlm_case
    layouts = [hf_parity.tp2_layout(root), hf_parity.pp2_layout(root, max_shard_size=None)]
    check_layouts(case, str(root / "hf"), 2, layouts)
    hf_parity.assert_exported(
        root / "tp2", transformers.RobertaForMaskedLM, state, source=root / "hf"
    )
    hf_parity.assert_exported(
        root / "pp2", transformers.RobertaForMaskedLM, state, source=root / "hf"
    )


def test_causal_lm_single_process(causal_case):
    root, case, state = causal_case
    model_path = "libai.models.RobertaForCausalLM"
    result = check_single_process(
        case, str(root / "hf"), {"model": model_path, "export_dir": str(root / "out1")}
    )
    assert "out_logits" in result
    hf_parity.assert_exported(
        root / "out1", transformers.RobertaForCausalLM, state, source=root / "hf"
    )


def test_causal_lm_dp2_tp2(causal_case):
    root, case, state = causal_case
    layouts = [hf_parity.dp2_tp2_layout(root)]
    check_layouts(case, str(root / "hf"), 4, layouts)
    hf_parity.assert_exported(
        root / "dp2tp2", transformers.RobertaForCausalLM, state, source=root / "hf"
    )


def test_causal_lm_is_causal_and_picked_from_config(causal_case):
    """The architecture in config.json picks RobertaForCausalLM; a later token never changes
    an earlier position's logits."""
    root, _, _ = causal_case
    dist.setup_dist_util({})
    model = load_huggingface(str(root / "hf")).eval()
    assert isinstance(model, RobertaForCausalLM)
    ids = torch.randint(3, VOCAB, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 3) % (VOCAB - 3) + 3
    with torch.no_grad():
        a, b = model(ids)["logits"], model(changed)["logits"]
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])


def test_base_model_and_defaults(mlm_case):
    root, _, state = mlm_case
    dist.setup_dist_util({})
    # RobertaForMaskedLM checkpoints have no pooler
    model = load_huggingface(str(root / "hf"), RobertaModel, add_pooling_layer=False).eval()
    hf = transformers.RobertaModel.from_pretrained(root / "hf", add_pooling_layer=False).eval()
    ids, mask, _ = make_batch(2, predicted=0, skip=1)
    with torch.no_grad():
        got = model(ids, mask)["last_hidden_state"]
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (got - want).abs().max() < 1e-5
    too_long = torch.full((1, SEQ + 1), 5)  # positions pad+1 .. pad+SEQ+1 exceed the table
    with pytest.raises(ValueError, match=f"{SEQ + 1} tokens needs max_position_embeddings"):
        model(too_long)
    cfg = RobertaForPreTraining(cfg=dict(hidden_size=16, hidden_layers=1, num_attention_heads=2))
    assert cfg.roberta.libai_cfg["pad_token_id"] == 1
    assert cfg.roberta.libai_cfg["num_tokentypes"] == 1 and cfg.roberta.pooler is None
