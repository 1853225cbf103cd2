"""RobertaForClassification from a Hugging Face ``RobertaForSequenceClassification`` equals
transformers (logits, loss, every gradient) on 1 process for classification and regression,
on tp2 and pp2, and exports back bitwise; from a masked-LM checkpoint it gets a fresh head."""

from __future__ import annotations

import json

import hf_parity
import pytest
import torch
import transformers
from hf_parity import check_layouts, check_single_process, hf_reference, save_case
from test_hf_roberta import BATCH, make_batch, tiny_config

from libai import dist
from libai.models import RobertaForClassification
from libai.models.utils import load_huggingface
from libai.models.utils.model_loader.roberta_loader import RobertaLoaderHuggerFace

HF_CLASS = transformers.RobertaForSequenceClassification


def classification_case(root, num_labels: int, seed: int):
    """A saved tiny ``RobertaForSequenceClassification`` and its reference; ``num_labels=1``
    is transformers' regression (float labels, mean squared error)."""
    torch.manual_seed(seed)
    hf = HF_CLASS(tiny_config(num_labels=num_labels))
    hf.save_pretrained(root / "hf")
    ids, mask, _ = make_batch(seed, predicted=0, skip=1)
    if num_labels == 1:
        labels = torch.randn(BATCH)
    else:
        labels = torch.randint(0, num_labels, (BATCH,), generator=torch.Generator().manual_seed(0))
    ref = hf_reference(
        hf,
        {"input_ids": ids, "attention_mask": mask, "labels": labels},
        lambda out: out.loss,
        {"logits": lambda out: out.logits},
    )
    batch = dict(
        input_ids=ids, attention_mask=mask, tokentype_ids=torch.zeros_like(ids), labels=labels
    )
    case = save_case(
        root / "case.pt", batch=batch, input_keys=["input_ids", "attention_mask"], ref=ref
    )
    return case, hf.state_dict()


@pytest.mark.parametrize("num_labels", [3, 1])
def test_single_process(num_labels, tmp_path):
    case, state = classification_case(tmp_path, num_labels, seed=num_labels)
    # no "model": config.json's architectures picks RobertaForClassification
    result = check_single_process(case, str(tmp_path / "hf"), {"export_dir": str(tmp_path / "o")})
    assert "out_logits" in result
    ref_grads = torch.load(case, weights_only=False)["ref"]["grads"]
    assert result["grads_checked"] == len(ref_grads) == len(state)  # every HF parameter
    exported = json.loads((tmp_path / "o" / "config.json").read_text())
    assert exported["architectures"] == ["RobertaForSequenceClassification"]
    assert len(exported["id2label"]) == num_labels
    hf_parity.assert_exported(tmp_path / "o", HF_CLASS, state)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_tp2_and_pp2(num_labels, tmp_path):
    """Both layouts in one torchrun launch; pp2 sends the (float, for regression) labels to
    the last stage as the pipeline target."""
    case, state = classification_case(tmp_path, num_labels, seed=num_labels)
    layouts = [hf_parity.tp2_layout(tmp_path), hf_parity.pp2_layout(tmp_path)]
    results = check_layouts(case, str(tmp_path / "hf"), 2, layouts)
    assert all("out_logits" in r for r in results["tp2"])
    # each stage checks only the parameters it holds: every HF parameter exactly once
    assert sum(r["grads_checked"] for r in results["pp2"]) == len(state)
    hf_parity.assert_exported(tmp_path / "tp2", HF_CLASS, state)
    hf_parity.assert_exported(tmp_path / "pp2", HF_CLASS, state)


def test_head_options():
    """``classifier_dropout`` (default: the hidden dropout) is the head's only dropout; the
    head's linears are replicated ``data``-parallel layers on the last stage."""
    dist.setup_dist_util({})
    cfg = dict(vocab_size=50, hidden_size=16, hidden_layers=1, num_attention_heads=2)
    cfg.update(intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = RobertaForClassification(cfg=cfg, num_labels=5, classifier_dropout=0.5)
    assert model.libai_cfg["num_labels"] == 5 and model.libai_cfg["classifier_dropout"] == 0.5
    assert model.classifier.dropout.p == 0.5 and model.classifier.layer_idx == -1
    assert {model.classifier.dense.parallel, model.classifier.out_proj.parallel} == {"data"}
    assert RobertaForClassification(cfg={**cfg, "hidden_dropout_prob": 0.2}).classifier.dropout.p
    ids = torch.full((2, 4), 7)
    assert not torch.equal(model(ids)["logits"], model(ids)["logits"])  # train: dropout on
    model.eval()
    assert torch.equal(model(ids)["logits"], model(ids)["logits"])
    assert model(ids)["logits"].shape == (2, 5)


def test_fresh_head_on_a_masked_lm_checkpoint(tmp_path, caplog):
    """As transformers does: the backbone is loaded, the missing head is initialized (the
    same values as a freshly built model's) and named in a warning."""
    torch.manual_seed(0)
    mlm = transformers.RobertaForMaskedLM(tiny_config())
    mlm.save_pretrained(tmp_path)
    dist.setup_dist_util({})
    with caplog.at_level("WARNING"):
        torch.manual_seed(5)
        model = load_huggingface(str(tmp_path), RobertaForClassification, num_labels=3)
    assert "newly initialized" in caplog.text
    head = [f"classifier.{m}.{k}" for m in ("dense", "out_proj") for k in ("weight", "bias")]
    assert all(name in caplog.text for name in head)
    torch.manual_seed(5)
    fresh = RobertaForClassification(cfg={**model.libai_cfg})
    for name, p in model.classifier.named_parameters():
        assert torch.equal(p, fresh.classifier.get_parameter(name)), name
    assert model.classifier.out_proj.weight.shape == (3, 32)
    assert model.classifier.dense.weight.std() > 0
    # every backbone tensor, mapped back to its Hugging Face name by the loader's own table
    params, want = dict(model.named_parameters()), mlm.state_dict()
    checked = 0
    for rule in RobertaLoaderHuggerFace.rules(model.libai_cfg, RobertaForClassification):
        if rule.libai_name.startswith("roberta."):
            for hf_name, value in rule.export(params[rule.libai_name].detach()).items():
                assert torch.equal(value, want[hf_name]), hf_name
                checked += 1
    assert checked == len([k for k in want if k.startswith("roberta.")])
    assert model.roberta.pooler is None and model.libai_cfg["pad_token_id"] == 1
