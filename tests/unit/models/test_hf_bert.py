"""BERT from a Hugging Face directory equals transformers (outputs, loss, every gradient) on
1 process for every head, on tp2 + pp2 and dp2 x tp2 for BertForPreTraining, and exports
back bitwise; bad input fails with a clear error."""

from __future__ import annotations

import json
import shutil

import hf_parity
import pytest
import torch
import transformers
from hf_parity import check_layouts, check_single_process, hf_reference, save_case

from libai import dist
from libai.models import BertForClassification, BertForPreTraining, BertModel
from libai.models.utils import CheckpointError, load_huggingface, save_huggingface

VOCAB, SEQ, BATCH, MASKED = 101, 12, 4, 3
LENGTHS = (12, 9, 12, 10)  # real tokens per row; the rest is padding (id 0)


def tiny_config(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ + 4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-3,  # away from the defaults: a loader ignoring it fails parity
        initializer_range=0.05,
    )
    return transformers.BertConfig(**{**base, **kw})


def make_batch(seed=0):
    """Padded rows with tokentypes, and exactly MASKED predicted tokens per row (so the loss
    of any row subset -- a dp rank, a micro-batch -- weighs tokens like the whole batch)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    tokentypes = torch.zeros(BATCH, SEQ, dtype=torch.long)
    loss_mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        tokentypes[row, n // 2 : n] = 1
        picked = 1 + torch.randperm(n - 1, generator=g)[:MASKED]
        loss_mask[row, picked] = 1
    ids = ids * mask  # padding is token 0 (pad_token_id)
    # an attended pad token: transformers' embedding (padding_idx) gives its row no gradient
    ids[0, 5] = 0
    return ids, mask, tokentypes, loss_mask


@pytest.fixture(scope="module")
def pretraining_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_bert")
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(tiny_config())
    hf.save_pretrained(root / "hf")
    ids, mask, tokentypes, loss_mask = make_batch()
    # the libai batch carries the original tokens everywhere; loss_mask selects the masked
    # ones (the -100 convention is covered by the RoBERTa tests)
    lm_labels = torch.randint(1, VOCAB, (BATCH, SEQ))
    hf_labels = lm_labels.masked_fill(loss_mask == 0, -100)
    ns_labels = torch.tensor([0, 1, 1, 0])
    ref = hf_reference(
        hf,
        {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": tokentypes,
            "labels": hf_labels,
            "next_sentence_label": ns_labels,
        },
        lambda out: out.loss,
        {
            "prediction_logits": lambda out: out.prediction_logits,
            "seq_relationship_logits": lambda out: out.seq_relationship_logits,
        },
    )
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        tokentype_ids=tokentypes,
        lm_labels=lm_labels,
        loss_mask=loss_mask,
        ns_labels=ns_labels,
    )
    case = save_case(
        root / "case.pt",
        batch=batch,
        input_keys=["input_ids", "attention_mask", "tokentype_ids"],
        ref=ref,
    )
    return root, case, hf.state_dict()


def test_pretraining_single_process(pretraining_case):
    root, case, state = pretraining_case
    result = check_single_process(
        case, str(root / "hf"), {"export_dir": str(root / "out1"), "max_shard_size": 20_000}
    )
    assert result["grads_checked"] >= 30  # every HF parameter (tied ones once)
    assert {"out_prediction_logits", "out_seq_relationship_logits"} <= set(result)
    assert (root / "out1" / "model.safetensors.index.json").exists()
    hf_parity.assert_exported(
        root / "out1", transformers.BertForPreTraining, state, source=root / "hf"
    )


def test_pretraining_tp2_and_pp2(pretraining_case):
    root, case, state = pretraining_case
    layouts = [hf_parity.tp2_layout(root), hf_parity.pp2_layout(root)]
    results = check_layouts(case, str(root / "hf"), 2, layouts)
    assert all("out_prediction_logits" in r for r in results["tp2"])
    hf_parity.assert_exported(
        root / "tp2", transformers.BertForPreTraining, state, source=root / "hf"
    )
    hf_parity.assert_exported(
        root / "pp2", transformers.BertForPreTraining, state, source=root / "hf"
    )


def test_pretraining_dp2_tp2(pretraining_case):
    root, case, state = pretraining_case
    layouts = [hf_parity.dp2_tp2_layout(root)]
    check_layouts(case, str(root / "hf"), 4, layouts)
    hf_parity.assert_exported(
        root / "dp2tp2", transformers.BertForPreTraining, state, source=root / "hf"
    )


def test_sequence_classification_single_process(tmp_path):
    torch.manual_seed(1)
    hf = transformers.BertForSequenceClassification(tiny_config(num_labels=3))
    hf.save_pretrained(tmp_path / "hf")
    ids, mask, tokentypes, _ = make_batch(seed=1)
    labels = torch.tensor([2, 0, 1, 2])
    ref = hf_reference(
        hf,
        {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": tokentypes,
            "labels": labels,
        },
        lambda out: out.loss,
        {"logits": lambda out: out.logits},
    )
    batch = dict(input_ids=ids, attention_mask=mask, tokentype_ids=tokentypes, labels=labels)
    case = save_case(
        tmp_path / "case.pt",
        batch=batch,
        input_keys=["input_ids", "attention_mask", "tokentype_ids"],
        ref=ref,
    )
    result = check_single_process(case, str(tmp_path / "hf"), {"export_dir": str(tmp_path / "o")})
    assert "out_logits" in result
    exported = json.loads((tmp_path / "o" / "config.json").read_text())
    assert exported["architectures"] == ["BertForSequenceClassification"]
    assert len(exported["id2label"]) == 3
    hf_parity.assert_exported(
        tmp_path / "o", transformers.BertForSequenceClassification, hf.state_dict()
    )


def test_base_model_from_a_head_checkpoint(pretraining_case, tmp_path):
    """BertModel loads from a BertForPreTraining directory (prefix ``bert.`` stripped) and
    gives transformers' last_hidden_state and pooler_output; it exports as a BertModel."""
    root, _, state = pretraining_case
    dist.setup_dist_util({})
    model = load_huggingface(str(root / "hf"), BertModel).eval()
    assert isinstance(model, BertModel)
    hf = transformers.BertModel.from_pretrained(root / "hf").eval()
    ids, mask, tokentypes, _ = make_batch(seed=2)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=tokentypes)
        got = model(ids, mask, tokentypes)
    for key in ("last_hidden_state", "pooler_output"):
        assert (got[key] - getattr(want, key)).abs().max() < 1e-5, key
    save_huggingface(model, str(tmp_path / "base"))
    backbone = {k[len("bert.") :]: v for k, v in state.items() if k.startswith("bert.")}
    hf_parity.assert_exported(tmp_path / "base", transformers.BertModel, backbone)


def test_built_from_cfg_records_hyper_parameters():
    dist.setup_dist_util({})
    cfg = dict(vocab_size=50, hidden_size=16, hidden_layers=1, num_attention_heads=2)
    model = BertForClassification(cfg={**cfg, "num_labels": 5, "intermediate_size": 32})
    assert model.libai_cfg["num_labels"] == 5 and model.libai_cfg["layernorm_eps"] == 1e-12
    assert model(torch.ones(2, 3, dtype=torch.long))["logits"].shape == (2, 5)
    pretrain = BertForPreTraining(cfg=cfg).eval()
    out = pretrain(torch.ones(2, 3, dtype=torch.long))
    assert out["prediction_logits"].shape == (2, 3, 50)
    assert out["seq_relationship_logits"].shape == (2, 2)
    with pytest.raises(ValueError, match="hidden_layer"):
        BertModel(cfg={**cfg, "hidden_layer": 3})


def test_tp_that_does_not_divide_heads_fails_before_building(tmp_path, monkeypatch):
    config = tiny_config(num_attention_heads=3, hidden_size=24)
    transformers.BertForPreTraining(config).save_pretrained(tmp_path)
    dist.setup_dist_util({})
    monkeypatch.setattr(dist, "get_tensor_parallel_size", lambda: 2)
    with pytest.raises(ValueError, match=r"num_attention_heads=3.*tensor_parallel_size=2"):
        load_huggingface(str(tmp_path))


def test_checkpoint_contradicting_config_is_a_clear_error(pretraining_case, tmp_path):
    root, _, _ = pretraining_case
    shutil.copytree(root / "hf", tmp_path / "bad")
    config = json.loads((tmp_path / "bad" / "config.json").read_text())
    config["intermediate_size"] = 48
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    dist.setup_dist_util({})
    with pytest.raises(
        CheckpointError, match=r"intermediate\.dense\.weight.*\[64, 32\].*\[48, 32\]"
    ):
        load_huggingface(str(tmp_path / "bad"))


def test_classifier_fine_tuning_starts_from_a_pretraining_checkpoint(pretraining_case, caplog):
    """As transformers does: the backbone is loaded, the missing classifier is initialized
    (the same values as a freshly built model's) and named in a warning."""
    root, _, state = pretraining_case
    dist.setup_dist_util({})
    with caplog.at_level("WARNING"):
        torch.manual_seed(5)
        model = load_huggingface(str(root / "hf"), BertForClassification, num_labels=3)
    assert "newly initialized" in caplog.text and "classifier.weight" in caplog.text
    torch.manual_seed(5)
    fresh = BertForClassification(cfg={**model.libai_cfg})
    assert torch.equal(model.classifier.weight, fresh.classifier.weight)
    assert model.classifier.weight.shape == (3, 32) and model.classifier.weight.std() > 0
    emb = state["bert.embeddings.word_embeddings.weight"]
    assert torch.equal(model.bert.embeddings.vocab_embeddings.weight, emb)
