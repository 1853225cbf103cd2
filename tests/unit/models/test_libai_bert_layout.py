"""LiBai's (Megatron's) BERT / RoBERTa layout -- picked by ``apply_residual_post_layernorm`` in
the config -- against transformers' ``MegatronBertForPreTraining`` / ``MegatronBertForMaskedLM``
(pre-LN BERT: no embedding LayerNorm, LayerNorm before attention and MLP, a final LayerNorm)
on the same weights, in fp32: logits, losses and every gradient."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from libai.config import LazyConfig
from libai.models import BertForPreTraining, RobertaForPreTraining
from libai.models.roberta_model import create_position_ids_from_input_ids

H, HEADS, LAYERS, VOCAB, SEQ, BATCH = 32, 2, 2, 64, 12, 3
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=H,
    hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=64,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    layernorm_eps=1e-5,
    apply_residual_post_layernorm=False,
)


def megatron_config(**kw):
    return transformers.MegatronBertConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=32,
        layer_norm_eps=1e-5,  # LiBai's configs; its BERT head LayerNorm has eps 1e-5 always
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **kw,
    )


def fuse_qkv(q, k, v):
    """transformers' q / k / v -> libai's query_key_value: per head [q_h; k_h; v_h] rows."""
    parts = [t.reshape(HEADS, H // HEADS, *t.shape[1:]) for t in (q, k, v)]
    return torch.stack(parts, dim=1).reshape(3 * H, *q.shape[1:])


def hf_to_libai(hf: dict, ours: str, theirs: str, heads: bool) -> dict:
    """Our state-dict names -> tensors taken from transformers' ``hf`` state dict."""
    m = {
        f"{ours}.embeddings.vocab_embeddings.weight": hf[
            f"{theirs}.embeddings.word_embeddings.weight"
        ],
        f"{ours}.embeddings.position_embeddings.weight": hf[
            f"{theirs}.embeddings.position_embeddings.weight"
        ],
        f"{ours}.embeddings.tokentype_embeddings.weight": hf[
            f"{theirs}.embeddings.token_type_embeddings.weight"
        ],
        f"{ours}.final_layernorm.weight": hf[f"{theirs}.encoder.ln.weight"],
        f"{ours}.final_layernorm.bias": hf[f"{theirs}.encoder.ln.bias"],
    }
    for i in range(LAYERS):
        a, b = f"{ours}.encoders.{i}", f"{theirs}.encoder.layer.{i}"
        for p in ("weight", "bias"):
            m[f"{a}.input_layernorm.{p}"] = hf[f"{b}.attention.ln.{p}"]
            m[f"{a}.self_attention.query_key_value.{p}"] = fuse_qkv(
                *(hf[f"{b}.attention.self.{n}.{p}"] for n in ("query", "key", "value"))
            )
            m[f"{a}.self_attention.dense.{p}"] = hf[f"{b}.attention.output.dense.{p}"]
            m[f"{a}.post_cross_attention_layernorm.{p}"] = hf[f"{b}.ln.{p}"]
            m[f"{a}.mlp.dense_h_to_4h.{p}"] = hf[f"{b}.intermediate.dense.{p}"]
            m[f"{a}.mlp.dense_4h_to_h.{p}"] = hf[f"{b}.output.dense.{p}"]
    head = "cls_head.predictions" if heads else "lm_head"
    for p in ("weight", "bias"):
        m[f"{head}.dense.{p}"] = hf[f"cls.predictions.transform.dense.{p}"]
        m[f"{head}.layernorm.{p}"] = hf[f"cls.predictions.transform.LayerNorm.{p}"]
        if heads:
            m[f"{ours}.pooler.dense.{p}"] = hf[f"{theirs}.pooler.dense.{p}"]
            m[f"cls_head.seq_relationship.{p}"] = hf[f"cls.seq_relationship.{p}"]
    m[f"{head}.lm_logits.bias"] = hf["cls.predictions.bias"]
    return m


def load(model, mapping: dict):
    state = model.state_dict()
    assert set(mapping) == set(state), set(state) ^ set(mapping)
    model.load_state_dict({k: v.detach().clone() for k, v in mapping.items()})


def grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    loss_mask = (torch.rand(BATCH, SEQ, generator=g) < 0.3).long() * mask
    loss_mask[:, 1] = 1
    lm_labels = torch.where(loss_mask.bool(), torch.randint(0, VOCAB, ids.shape, generator=g), -1)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "tokentype_ids": types,
        "ns_labels": torch.tensor([0, 1, 1]),
        "lm_labels": lm_labels,  # -1 off the masked positions, as LiBai's dataset writes
        "loss_mask": loss_mask,
    }


def test_bert_libai_layout_equals_megatron_bert(batch):
    torch.manual_seed(0)
    hf = transformers.MegatronBertForPreTraining(megatron_config()).train()
    ours = BertForPreTraining(**TINY).train()
    assert ours.bert.libai_layout and ours.bert.embeddings.layernorm is None
    load(ours, hf_to_libai(hf.state_dict(), "bert", "bert", heads=True))

    labels = torch.where(batch["loss_mask"].bool(), batch["lm_labels"], -100)
    ref = hf(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["tokentype_ids"],
        labels=labels,
        next_sentence_label=batch["ns_labels"],
    )
    ref.loss.backward()
    out = ours(**batch)
    assert set(out) == {"lm_loss", "sop_loss"}
    (out["lm_loss"] + out["sop_loss"]).backward()
    torch.testing.assert_close(out["lm_loss"] + out["sop_loss"], ref.loss, rtol=1e-6, atol=1e-6)

    theirs = hf_to_libai(grads(hf), "bert", "bert", heads=True)
    # the decoder is tied to the word embedding: its gradient sums both uses in both models
    for name, g in grads(ours).items():
        torch.testing.assert_close(g, theirs[name], rtol=1e-5, atol=1e-6, msg=name)

    ours.eval()
    with torch.no_grad():
        logits = ours(**{k: batch[k] for k in ("input_ids", "attention_mask", "tokentype_ids")})
    real = batch["attention_mask"].bool()  # padded rows attend differently (unused anyway)
    torch.testing.assert_close(
        logits["prediction_logits"][real],
        ref.prediction_logits.detach()[real],
        rtol=1e-5,
        atol=1e-5,
    )
    torch.testing.assert_close(
        logits["seq_relationship_logits"],
        ref.seq_relationship_logits.detach(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_roberta_libai_layout_equals_megatron_bert_with_roberta_positions(batch):
    """LiBai's RoBERTa is the same pre-LN encoder with RoBERTa's positions (counted past
    padding from pad_token_id + 1) and one token type."""
    torch.manual_seed(1)
    hf = transformers.MegatronBertForMaskedLM(megatron_config(type_vocab_size=1)).train()
    ours = RobertaForPreTraining(**{**TINY, "num_tokentypes": 1, "pad_token_id": 1}).train()
    load(ours, hf_to_libai(hf.state_dict(), "roberta", "bert", heads=False))
    ids = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 1)
    labels = torch.where(batch["loss_mask"].bool(), batch["lm_labels"], -100)
    ref = hf(
        input_ids=ids,
        attention_mask=batch["attention_mask"],
        position_ids=create_position_ids_from_input_ids(ids, 1),
        labels=labels,
    )
    ref.loss.backward()
    out = ours(
        ids, batch["attention_mask"], lm_labels=batch["lm_labels"], loss_mask=batch["loss_mask"]
    )
    out["lm_loss"].backward()
    torch.testing.assert_close(out["lm_loss"], ref.loss, rtol=1e-6, atol=1e-6)
    theirs = hf_to_libai(grads(hf), "roberta", "bert", heads=False)
    for name, g in grads(ours).items():
        if name.endswith("position_embeddings.weight"):  # RoBERTa's padding row gets none
            g, theirs[name] = g[2:], theirs[name][2:]
        torch.testing.assert_close(g, theirs[name], rtol=1e-5, atol=1e-6, msg=name)


def test_libai_config_keys_build_the_libai_layout(caplog):
    """LiBai's common/models/bert.py cfg (fusion flags, add_binary_head, amp_enabled, ...)
    builds the Megatron layout; keys that change nothing are named in one log line. Without
    apply_residual_post_layernorm the model stays Hugging Face's post-LN BERT."""
    cfg = LazyConfig.load("tests/fixtures/libai/configs/common/models/bert.py").cfg
    small = {**cfg, "hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}
    small.update(num_attention_heads=2, vocab_size=128)
    with caplog.at_level(logging.INFO):
        model = BertForPreTraining(cfg={**small, "add_binary_head": False})
    assert model.bert.libai_layout and model.bert.final_layernorm is not None
    assert model.cls_head.seq_relationship is None  # add_binary_head=False: no NSP head
    assert model.bert.encoders["0"].pre_norm
    assert not model.bert.encoders["0"].apply_residual_post_layernorm
    simcse = BertForPreTraining(cfg={**small, "apply_residual_post_layernorm": True})
    assert simcse.bert.encoders["0"].apply_residual_post_layernorm  # SimCSE's configs
    assert simcse.bert.libai_layout and simcse.bert.final_layernorm is not None
    assert "bias_gelu_fusion" in caplog.text and "amp_enabled" in caplog.text
    out = model(torch.randint(0, 100, (2, 8)), lm_labels=torch.randint(0, 100, (2, 8)))
    assert set(out) == {"lm_loss"}
    hf_layout = BertForPreTraining(
        vocab_size=64, hidden_size=32, hidden_layers=1, num_attention_heads=2
    )
    assert not hf_layout.bert.libai_layout and hf_layout.bert.final_layernorm is None
    assert not hf_layout.bert.encoders["0"].pre_norm
    assert hf_layout.bert.embeddings.layernorm is not None


def test_libai_layout_is_not_exported_as_a_hugging_face_bert(tmp_path):
    """Hugging Face's BERT / RoBERTa have no final LayerNorm: exporting LiBai's layout is a
    clear error, not a checkpoint that loads wrong."""
    from libai.models.utils import save_huggingface

    for cls in (BertForPreTraining, RobertaForPreTraining):
        with pytest.raises(NotImplementedError, match="apply_residual_post_layernorm"):
            save_huggingface(cls(**TINY), str(tmp_path / cls.__name__))
