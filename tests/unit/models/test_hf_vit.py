"""ViT from a Hugging Face directory on 1 process, tp2, pp2 and dp2 x tp2 equals transformers
(logits, loss, every gradient), exports back bitwise, and rejects bad input clearly."""

from __future__ import annotations

import json
import shutil

import hf_parity
import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_parity import (
    check_layouts,
    check_single_process,
    checkpoint_named,
    hf_reference,
    save_case,
)

from libai import dist
from libai.models.utils import CheckpointError, load_huggingface

LABELS = 5


@pytest.fixture(scope="module")
def vit_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_vit")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,  # mlp_ratio 1.5, divisible by tp
        num_labels=LABELS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
    )
    hf = transformers.ViTForImageClassification(config)
    hf.save_pretrained(root / "hf")
    images = torch.randn(4, 3, 16, 16)
    labels = torch.tensor([0, 3, 4, 1])
    ref = hf_reference(
        hf,
        {"pixel_values": images},
        lambda out: F.cross_entropy(out.logits, labels),
        {"logits": lambda out: out.logits},
    )
    ref["grads"] = checkpoint_named(hf, ref["grads"], root / "grads")
    case = save_case(
        root / "case.pt",
        batch={"images": images, "labels": labels},
        input_keys=["images"],
        ref=ref,
    )
    return root, case, hf.state_dict()


def assert_vit_exported(path, want: dict) -> None:
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"]
    hf_parity.assert_exported(path, transformers.ViTForImageClassification, want)


def test_single_process(vit_case):
    root, case, state = vit_case
    result = check_single_process(
        case, str(root / "hf"), {"export_dir": str(root / "out1"), "max_shard_size": 20_000}
    )
    # every HF tensor's gradient was compared (2 layers x 16 + 8 outside the blocks)
    assert result["grads_checked"] == 40, result
    assert (root / "out1" / "model.safetensors.index.json").exists()
    assert_vit_exported(root / "out1", state)


def test_tp2_and_pp2(vit_case):
    root, case, state = vit_case
    layouts = [hf_parity.tp2_layout(root), hf_parity.pp2_layout(root)]
    results = check_layouts(case, str(root / "hf"), 2, layouts)
    # pp2: each stage checked only its own parameters (embeddings + block 0 / block 1 + head)
    assert sum(r["grads_checked"] for r in results["pp2"]) == 40, results["pp2"]
    assert_vit_exported(root / "tp2", state)
    assert_vit_exported(root / "pp2", state)


def test_dp2_tp2(vit_case):
    root, case, state = vit_case
    layouts = [hf_parity.dp2_tp2_layout(root)]
    check_layouts(case, str(root / "hf"), 4, layouts)
    assert_vit_exported(root / "dp2tp2", state)


def test_images_of_the_wrong_size_are_a_clear_error(vit_case):
    root, _, _ = vit_case
    dist.setup_dist_util({})
    model = load_huggingface(str(root / "hf"))
    with pytest.raises(ValueError, match=r"expects images \[batch, 3, 16, 16\].*\[2, 3, 32, 32\]"):
        model(torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"in_chans=3.*\[2, 1, 16, 16\]"):
        model(torch.randn(2, 1, 16, 16))


def test_heads_not_divisible_by_tp_fail_before_building(vit_case, monkeypatch, tmp_path):
    root, _, _ = vit_case
    hf_dir = tmp_path / "hf3"
    shutil.copytree(root / "hf", hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    config["num_attention_heads"] = 3  # only the layout check reads it: it must come first
    (hf_dir / "config.json").write_text(json.dumps(config))
    dist.setup_dist_util({})
    monkeypatch.setattr(dist, "get_tensor_parallel_size", lambda: 2)
    built = []
    monkeypatch.setattr(
        "libai.models.vit.VisionTransformer.__init__",
        lambda *a, **k: built.append(1),
    )
    with pytest.raises(ValueError, match=r"num_heads=3.*tensor_parallel_size=2"):
        load_huggingface(str(hf_dir))
    assert not built


def test_model_rejects_heads_not_divisible_by_tp(monkeypatch):
    from libai.models import VisionTransformer

    dist.setup_dist_util({})
    monkeypatch.setattr(dist, "get_tensor_parallel_size", lambda: 2)
    with pytest.raises(ValueError, match=r"num_heads=3 is not divisible by tensor_parallel_size=2"):
        VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=1, num_heads=3)


def test_checkpoint_shapes_that_contradict_config_json(vit_case, tmp_path):
    root, _, _ = vit_case
    hf_dir = tmp_path / "hf_bad"
    shutil.copytree(root / "hf", hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    config["image_size"] = 20  # 25 patches + cls: the checkpoint's positions are 17
    (hf_dir / "config.json").write_text(json.dumps(config))
    dist.setup_dist_util({})
    with pytest.raises(
        CheckpointError, match=r"vit\.embeddings\.position_embeddings: checkpoint \[1, 17, 32\]"
    ):
        load_huggingface(str(hf_dir))


def test_drop_path_is_refused():
    from libai.models import VisionTransformer

    dist.setup_dist_util({})
    with pytest.raises(NotImplementedError, match="drop_path_rate=0.1"):
        VisionTransformer(
            img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=4, drop_path_rate=0.1
        )


def test_vit_model_backbone_loads_with_a_fresh_head(vit_case, tmp_path, caplog):
    """A ``ViTModel`` checkpoint (backbone + pooler, no classifier) fine-tunes: the backbone
    is loaded, the pooler ignored, the head of ``num_classes`` freshly initialized."""
    root, case, _ = vit_case
    hf = transformers.ViTForImageClassification.from_pretrained(root / "hf")
    backbone = transformers.ViTModel(hf.config)  # with a pooler
    backbone.load_state_dict(hf.vit.state_dict(), strict=False)
    backbone.save_pretrained(tmp_path / "base")
    dist.setup_dist_util({})
    torch.manual_seed(1)
    model = load_huggingface(str(tmp_path / "base"), num_classes=7)
    assert model.head.weight.shape == (7, 32) and model.head.weight.abs().sum() > 0
    assert "newly initialized: ['head.weight', 'head.bias']" in caplog.text
    images = torch.load(case, weights_only=False)["batch"]["images"]
    model.eval()
    hf.eval()
    with torch.no_grad():
        want = hf.vit(pixel_values=images).last_hidden_state
        got = model.forward_features(images)
    assert (got - want).abs().max() < 1e-5
