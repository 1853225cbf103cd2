"""FleetX's ERNIE pretraining YAML (tests/fixtures/fleetx, byte for byte, with its _base_)
through ``Model.module: ErnieModule`` on the zoo's BERT, shrunk by ``-o``: the model follows
FleetX's ``Model`` keys (task-type embedding included), and its masked-LM + sentence-pair
loss equals transformers' ``ErnieForPreTraining`` on the same weights and batch (exported
to and loaded back from a transformers ERNIE directory)."""

from __future__ import annotations

import json

import pytest
import torch
from fleetx_reference import FLEETX

from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config
from libai.fleetx.yaml_setup import resolve_module_class

YAML = FLEETX / "ppfleetx/configs/nlp/ernie/pretrain_ernie_base_345M_single_card.yaml"
TINY = [
    "Global.device=cpu",
    "Model.vocab_size=64",
    "Model.hidden_size=32",
    "Model.num_hidden_layers=2",
    "Model.num_attention_heads=2",
    "Model.max_position_embeddings=32",
    "Model.hidden_dropout_prob=0.0",
    "Model.attention_probs_dropout_prob=0.0",
    "Model.task_id=1",
]


def _module(overrides=()):
    cfg = load_yaml_config(YAML, [*TINY, *overrides])
    torch.manual_seed(0)
    return resolve_module_class(cfg.Model.module)(cfg)


def _batch(vocab=64, seq=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (3, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ids[1, 9:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = torch.randint(0, 4, (3, 1), generator=g)  # type_vocab_size 4 in the YAML
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5, 7]] = torch.randint(1, vocab, (3, 3), generator=g)
    labels[1, 7] = -100
    ns = torch.tensor([0, 1, 1])
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "tokentype_ids": types,
        "lm_labels": labels,
        "ns_labels": ns,
    }


def _hf_loss(path, batch, task_id):
    from transformers import ErnieForPreTraining

    hf = ErnieForPreTraining.from_pretrained(path).eval()
    with torch.no_grad():
        out = hf(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["tokentype_ids"],
            task_type_ids=torch.full_like(batch["input_ids"], task_id),
            labels=batch["lm_labels"],
            next_sentence_label=batch["ns_labels"],
        )
    return out.loss


def _loss(module, batch):
    module.train()
    with torch.no_grad():
        out = module.model(**module.pretreating_batch(batch))
    return sum(out.values()), out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from libai.models.utils import save_huggingface

    module = _module()
    path = tmp_path_factory.mktemp("ernie_hf")
    save_huggingface(module.model, str(path))
    return module, path


def test_ernie_module_follows_fleetx_model_keys(exported):
    module, path = exported
    cfg = module.model.bert.libai_cfg
    # the 345M file's keys (intermediate_size null = 4 x hidden, as FleetX's module)
    assert cfg["num_tokentypes"] == 4 and cfg["intermediate_size"] == 128
    assert cfg["hidden_layers"] == 2 and cfg["activation"] == "gelu"
    emb = module.model.bert.embeddings
    assert emb.task_type_embeddings.weight.shape == (3, 32) and emb.task_id == 1
    hf_cfg = json.loads((path / "config.json").read_text())
    assert hf_cfg["model_type"] == "ernie" and hf_cfg["use_task_id"] is True
    assert (hf_cfg["type_vocab_size"], hf_cfg["task_type_vocab_size"]) == (4, 3)


def test_ernie_module_loss_equals_transformers(exported):
    module, path = exported
    batch = _batch()
    total, out = _loss(module, batch)
    assert set(out) == {"lm_loss", "sop_loss"}  # Global.binary_head: True in the base file
    torch.testing.assert_close(total, _hf_loss(path, batch, task_id=1), rtol=1e-5, atol=1e-6)
    # the same weights loaded back through Model.pretrained give the same loss
    loaded = _module([f"+Model.pretrained={path}"])
    torch.testing.assert_close(_loss(loaded, batch)[0], total, rtol=1e-6, atol=1e-6)


def test_binary_head_off_is_masked_lm_only(exported):
    module, _ = exported
    module.cfg.Global.binary_head = False
    try:
        total, out = _loss(module, _batch())
    finally:
        module.cfg.Global.binary_head = True
    assert set(out) == {"lm_loss"}


def test_ernie_module_errors():
    with pytest.raises(ValueError, match="Model.task_id=5 .*task_type_vocab_size=3"):
        _module(["Model.task_id=5"])
    with pytest.raises(ValueError, match="unknown config key Model.num_layerz"):
        _module(["+Model.num_layerz=3"])
    cfg = load_yaml_config(YAML, [*TINY, "Model.module=ErnieSeqClsModule"])
    with pytest.raises(YAMLConfigError, match="ErnieSeqClsModule"):
        resolve_module_class(cfg.Model.module)
