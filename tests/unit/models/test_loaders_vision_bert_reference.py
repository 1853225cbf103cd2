"""The BERT, Swin and ViT loaders' config translation against transformers' own config
classes: a libai model built from a config (no checkpoint to carry settings from) exports a
``config.json`` whose every translated field reaches transformers (the reloaded model gives
the libai model's logits), and a ``config.json`` that lacks a key loads with transformers'
default for it (the libai model gives the transformers model's logits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_parity import edit_config
from test_swin import hf_swin

from libai import dist
from libai.models import BertForClassification, SwinTransformer
from libai.models.utils import load_huggingface, save_huggingface

TOL = 1e-5


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# ---- BERT -----------------------------------------------------------------------------------


def test_bert_classifier_export_carries_vocab_tokentypes_and_classifier_dropout(tmp_path):
    """A BertForClassification built (not loaded) with a vocabulary of 37, 3 token types and
    classifier_dropout 0.3: transformers reloads the export with exactly those settings (its
    classifier Dropout has p=0.3, not the 0.0 hidden dropout) and the same eval logits."""
    dist.setup_dist_util({})
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=37,
        hidden_size=16,
        hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_tokentypes=3,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForClassification(cfg=cfg, num_labels=4, classifier_dropout=0.3).eval()
    save_huggingface(model, str(tmp_path / "out"))
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert hf.config.vocab_size == 37
    assert hf.config.type_vocab_size == 3
    assert hf.config.classifier_dropout == 0.3 and hf.dropout.p == 0.3
    assert hf.config.num_labels == 4
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 37, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    tokentypes = torch.tensor([[0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 0, 1, 2, 0]])
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=tokentypes).logits
        got = model(ids, mask, tokentypes)["logits"]
    assert max_diff(got, want) < TOL


def test_bert_config_with_num_labels_but_no_id2label(tmp_path):
    """A config.json giving ``num_labels: 3`` without ``id2label`` (transformers' config
    accepts it: 3 labels) loads a 3-label classifier equal to transformers'."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=41,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    edit_config(tmp_path, drop=["id2label", "label2id"], num_labels=3)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert hf.config.num_labels == 3
    dist.setup_dist_util({})
    model = load_huggingface(str(tmp_path)).eval()
    assert isinstance(model, BertForClassification)
    ids = torch.randint(1, 41, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = model(ids, mask, torch.zeros_like(ids))["logits"]
    assert max_diff(got, want) < TOL


# ---- Swin -----------------------------------------------------------------------------------


def test_swin_export_carries_attention_dropout_ape_and_qkv_bias(tmp_path):
    """A SwinTransformer built (not loaded) with attn_drop_rate 0.25, an absolute position
    embedding and no qkv bias: transformers reloads the export with those three settings
    (its defaults are 0.0 / False / True) and gives the libai model's eval logits."""
    dist.setup_dist_util({})
    torch.manual_seed(0)
    model = SwinTransformer(
        img_size=16,
        patch_size=4,
        num_classes=3,
        embed_dim=8,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=2,
        qkv_bias=False,
        attn_drop_rate=0.25,
        drop_path_rate=0.0,
        ape=True,
    )
    with torch.no_grad():  # the absolute position embedding starts at zero: make it matter
        model.patch_embed.absolute_pos_embed.normal_()
    model.eval()
    save_huggingface(model, str(tmp_path / "out"))
    hf = transformers.SwinForImageClassification.from_pretrained(tmp_path / "out").eval()
    assert hf.config.attention_probs_dropout_prob == 0.25
    assert hf.config.use_absolute_embeddings is True
    assert hf.config.qkv_bias is False
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(pixel_values=images).logits
        got = model(images)["logits"]
    assert max_diff(got, want) < TOL


@pytest.fixture
def swin_dir(tmp_path):
    """A tiny transformers Swin v1 (dropouts and drop path 0) saved to ``tmp_path``."""
    hf = hf_swin("v1")
    hf.save_pretrained(tmp_path)
    return tmp_path


def test_swin_config_without_hidden_act_uses_transformers_default(swin_dir):
    """No ``hidden_act`` in config.json: transformers' SwinConfig default ("gelu") applies,
    which the loader supports; the libai eval logits equal transformers'."""
    edit_config(swin_dir, drop=["hidden_act"])
    hf = transformers.SwinForImageClassification.from_pretrained(swin_dir).eval()
    assert hf.config.hidden_act == transformers.SwinConfig().hidden_act == "gelu"
    dist.setup_dist_util({})
    model = load_huggingface(str(swin_dir)).eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(pixel_values=images).logits
        got = model(images)["logits"]
    assert max_diff(got, want) < TOL


def test_swin_config_without_attention_dropout_uses_transformers_default(swin_dir):
    """No ``attention_probs_dropout_prob`` in config.json: transformers' SwinConfig default
    (0.0) applies, so a training step (no other dropout, no drop path) is deterministic and
    its loss equals transformers' train-mode cross entropy."""
    edit_config(swin_dir, drop=["attention_probs_dropout_prob"])
    default = transformers.SwinConfig().attention_probs_dropout_prob
    hf = transformers.SwinForImageClassification.from_pretrained(swin_dir).train()
    assert hf.config.attention_probs_dropout_prob == default == 0.0
    dist.setup_dist_util({})
    model = load_huggingface(str(swin_dir)).train()
    assert model.libai_cfg["attn_drop_rate"] == default
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    labels = torch.tensor([1, 4])
    with torch.no_grad():
        want = F.cross_entropy(hf(pixel_values=images).logits, labels)
        got = model(images, labels)["losses"]
    assert abs(got.item() - want.item()) < TOL


# ---- ViT ------------------------------------------------------------------------------------


@pytest.fixture
def vit_dir(tmp_path):
    """A tiny transformers ViT with 32x32 images and transformers' default patch size (16)."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path)
    return tmp_path


def _vit_matches_transformers(path) -> None:
    hf = transformers.ViTForImageClassification.from_pretrained(path).eval()
    dist.setup_dist_util({})
    model = load_huggingface(str(path)).eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf(pixel_values=images).logits
        got = model(images)["logits"]
    assert max_diff(got, want) < TOL


def test_vit_config_without_patch_size_uses_transformers_default(vit_dir):
    """No ``patch_size`` in config.json: transformers' ViTConfig default (16) applies; the
    libai model loads with it and gives transformers' logits."""
    edit_config(vit_dir, drop=["patch_size"])
    assert transformers.ViTConfig().patch_size == 16
    _vit_matches_transformers(vit_dir)


def test_vit_config_without_hidden_act_uses_transformers_default(vit_dir):
    """No ``hidden_act`` in config.json: transformers' ViTConfig default ("gelu") applies;
    the libai model loads with it and gives transformers' logits."""
    edit_config(vit_dir, drop=["hidden_act"])
    assert transformers.ViTConfig().hidden_act == "gelu"
    _vit_matches_transformers(vit_dir)


def test_vit_non_square_patch_error_names_the_key(vit_dir):
    """A rectangular ``patch_size`` is refused with a message naming config.json's key."""
    edit_config(vit_dir, patch_size=[16, 8])
    dist.setup_dist_util({})
    with pytest.raises(ValueError, match=r"ViT patch_size=\[16, 8\]: only square"):
        load_huggingface(str(vit_dir))
