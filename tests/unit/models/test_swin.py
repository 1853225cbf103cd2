"""Swin Transformer v1 / v2 loaded from tiny random transformers models equal transformers
(eval logits, the training loss and every gradient) on 1 process, tp2 and pp2; the exports
reload in transformers; v2's pretrained_window_sizes act as in transformers; the loss
contract with a soft-target loss; LiBai's own swin / swinv2 config files build and run."""

from __future__ import annotations

from pathlib import Path

import hf_parity
import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_parity import check_layouts, check_single_process, checkpoint_named, hf_reference, save_case

from libai import dist
from libai.config import LazyConfig, instantiate
from libai.models import SwinTransformer, SwinTransformerV2
from libai.models.utils import load_huggingface

LABELS = 5
ROOT = Path(__file__).resolve().parents[2]
LIBAI_MODELS = ROOT / "fixtures" / "libai" / "configs" / "common" / "models"
HF_CLASSES = {
    "v1": transformers.SwinForImageClassification,
    "v2": transformers.Swinv2ForImageClassification,
}


def hf_swin(version: str, pretrained_window_sizes=(3, 2), seed: int = 0, **options):
    """A tiny random transformers Swin: 32x32 images, patches of 4 (an 8x8 map), windows of
    4 (stage 0 shifted, stage 1 one window), every tensor perturbed so none is trivial; v1
    with an absolute position embedding (``ape``), v2 without."""
    kw = dict(
        use_absolute_embeddings=version == "v1",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        num_labels=LABELS,
        drop_path_rate=0.0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **options,
    )
    if version == "v2":
        config = transformers.Swinv2Config(
            pretrained_window_sizes=list(pretrained_window_sizes), **kw
        )
    else:
        config = transformers.SwinConfig(**kw)
    torch.manual_seed(seed)
    model = HF_CLASSES[version](config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def build_case(version: str, root: Path) -> dict:
    """The transformers model saved to ``root / "hf"`` and its reference (logits, the loss
    and every gradient by checkpoint name) saved for :mod:`hf_parity`."""
    hf = hf_swin(version)
    hf.save_pretrained(root / "hf")
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 4, 1])
    ref = hf_reference(
        hf,
        {"pixel_values": images},
        lambda out: F.cross_entropy(out.logits, labels),
        {"logits": lambda out: out.logits, "prediction_scores": lambda out: out.logits},
    )
    ref["grads"] = checkpoint_named(hf, ref["grads"], root / "grads")
    case = save_case(
        root / "case.pt",
        batch={"images": images, "labels": labels},
        input_keys=["images"],
        ref=ref,
    )
    state = HF_CLASSES[version].from_pretrained(root / "hf").state_dict()
    return dict(root=root, case=case, hf=root / "hf", state=state, grads=len(ref["grads"]))


@pytest.fixture(scope="module")
def swin_cases(tmp_path_factory) -> dict:
    return {v: build_case(v, tmp_path_factory.mktemp(f"hf_swin_{v}")) for v in HF_CLASSES}


def assert_exported(version: str, path: Path, case: dict) -> None:
    hf_parity.assert_exported(path, HF_CLASSES[version], case["state"], source=case["hf"])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_single_process(swin_cases, version):
    """Eval logits within 1e-5, the training loss (``losses``) equal to transformers' cross
    entropy, every gradient by transformers' name; the export reloads bit for bit."""
    c = swin_cases[version]
    result = check_single_process(c["case"], str(c["hf"]), {"export_dir": str(c["root"] / "out1")})
    assert result["out_logits"] < 1e-5 and result["out_prediction_scores"] < 1e-5, result
    assert result["loss"] < 1e-5, result
    assert result["grads_checked"] == c["grads"], result
    assert_exported(version, c["root"] / "out1", c)


def test_tp2_and_pp2(swin_cases):
    """v1 and v2 in one 2-process launch. tp2: each rank holds half of every MLP projection
    (column / row parallel) and nothing else split; pp2 over the 4 blocks: the stages
    together check every gradient. Every layout's export reloads in transformers."""
    layouts = []
    for version, c in swin_cases.items():
        paths = {"case": c["case"], "hf_dir": str(c["hf"])}
        tp2 = {**hf_parity.tp2_layout(c["root"]), **paths, "name": f"tp2_{version}"}
        pp2 = {**hf_parity.pp2_layout(c["root"], max_shard_size=None), **paths}
        pp2["name"] = f"pp2_{version}"
        pp2["dist"]["pipeline_num_layers"] = 4  # sum(depths), as LiBai's configs set it
        layouts += [tp2, pp2]
    first = swin_cases["v1"]
    results = check_layouts(first["case"], str(first["hf"]), 2, layouts)
    for version, c in swin_cases.items():
        for rank in results[f"tp2_{version}"]:
            sharded = rank["sharded"]
            assert len(sharded) == 4 * 3, sorted(sharded)  # 4 blocks x (h_to_4h w, b; 4h_to_h w)
            assert sharded["layers.0.blocks.0.mlp.dense_h_to_4h.weight"] == [[32, 16], [64, 16]]
            assert sharded["layers.1.blocks.3.mlp.dense_4h_to_h.weight"] == [[32, 64], [32, 128]]
        pp2 = results[f"pp2_{version}"]
        assert sum(r["grads_checked"] for r in pp2) == c["grads"], pp2
        assert all(r["grads_checked"] > 0 for r in pp2)
        assert_exported(version, c["root"] / "tp2", c)
        assert_exported(version, c["root"] / "pp2", c)


def _eval_logits(model, images):
    model.eval()
    with torch.no_grad():
        out = model(images)
    return out.logits if hasattr(out, "logits") else out["prediction_scores"]


def test_v2_pretrained_window_sizes_zero_and_nonzero(tmp_path):
    """The same weights under pretrained_window_sizes [0, 0] and [3, 2] give different
    logits, each equal to transformers' with that setting (the override reaches the bias)."""
    dist.setup_dist_util({})
    images = torch.randn(2, 3, 32, 32)
    hf = hf_swin("v2", pretrained_window_sizes=(3, 2))
    hf.save_pretrained(tmp_path / "hf")
    zero = transformers.Swinv2ForImageClassification.from_pretrained(
        tmp_path / "hf", pretrained_window_sizes=[0, 0]
    )
    want_nonzero, want_zero = _eval_logits(hf, images), _eval_logits(zero, images)
    assert (want_nonzero - want_zero).abs().max() > 1e-3
    got_nonzero = _eval_logits(load_huggingface(str(tmp_path / "hf")), images)
    got_zero = _eval_logits(
        load_huggingface(str(tmp_path / "hf"), pretrained_window_sizes=[0, 0]), images
    )
    assert (got_nonzero - want_nonzero).abs().max() < 1e-5
    assert (got_zero - want_zero).abs().max() < 1e-5


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_without_qkv_bias(version, tmp_path):
    dist.setup_dist_util({})
    hf = hf_swin(version, qkv_bias=False)
    hf.save_pretrained(tmp_path / "hf")
    model = load_huggingface(str(tmp_path / "hf"))
    assert model.libai_cfg["qkv_bias"] is False
    images = torch.randn(2, 3, 32, 32)
    assert (_eval_logits(model, images) - _eval_logits(hf, images)).abs().max() < 1e-5


def test_loss_func_soft_targets_and_eval_contract(tmp_path):
    """LiBai's contract: ``{"losses"}`` in training from the given ``loss_func`` (soft
    targets, as its configs' mixup + SoftTargetCrossEntropy); in eval ``prediction_scores``
    (also as ``logits``), and with class ids a cross entropy ``losses``."""
    dist.setup_dist_util({})
    hf = hf_swin("v1")
    hf.save_pretrained(tmp_path / "hf")
    images = torch.randn(3, 3, 32, 32)
    want = _eval_logits(hf, images)

    def soft_ce(logits, target):
        return (-target * logits.log_softmax(-1)).sum(-1).mean()

    model = load_huggingface(str(tmp_path / "hf"), loss_func=soft_ce)
    soft = torch.softmax(torch.randn(3, LABELS), -1)
    model.train()
    out = model(images, soft)
    assert set(out) == {"losses"}
    assert abs(out["losses"].item() - soft_ce(want, soft).item()) < 1e-5
    model.eval()
    ids = torch.tensor([1, 0, 4])
    with torch.no_grad():
        out = model(pixel_values=images, labels=ids)
    assert set(out) == {"losses", "prediction_scores", "logits"}
    assert out["logits"] is out["prediction_scores"]
    assert abs(out["losses"].item() - F.cross_entropy(want, ids).item()) < 1e-5


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_backbone_loads_with_a_fresh_head(version, tmp_path, caplog):
    """A ``SwinModel`` / ``Swinv2Model`` checkpoint (no classifier) fine-tunes: the backbone
    loads (pooled features equal transformers'), the head of ``num_classes`` is new."""
    dist.setup_dist_util({})
    hf = hf_swin(version)
    backbone = hf.base_model
    backbone.save_pretrained(tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"), num_classes=7)
    assert model.head.weight.shape == (7, 32)
    assert "newly initialized: ['head.weight', 'head.bias']" in caplog.text
    images = torch.randn(2, 3, 32, 32)
    model.eval()
    backbone.eval()
    with torch.no_grad():
        want = backbone(pixel_values=images).pooler_output
        assert (model.forward_features(images) - want).abs().max() < 1e-5


def test_bad_input_is_a_clear_error():
    dist.setup_dist_util({})
    small = dict(img_size=32, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
    model = SwinTransformer(**small)
    with pytest.raises(ValueError, match=r"expects images \[batch, 3, 32, 32\].*\[2, 3, 16, 16\]"):
        model(torch.randn(2, 3, 16, 16))
    with pytest.raises(ValueError, match=r"num_heads=\[2\] needs one entry per stage"):
        SwinTransformer(**{**small, "num_heads": [2]})
    with pytest.raises(ValueError, match=r"pretrained_window_sizes=\[0\] needs one entry"):
        SwinTransformerV2(**small, pretrained_window_sizes=[0])
    with pytest.raises(ValueError, match=r"pretrained_window_sizes=\[0, 0, 8\] needs one entry"):
        SwinTransformerV2(**small, pretrained_window_sizes=[0, 0, 8])
    SwinTransformerV2(**small, pretrained_window_sizes=[0, 0, 0, 0])  # LiBai's default: accepted
    with pytest.raises(ValueError, match=r"8x8 .* not divisible by window_size=3"):
        SwinTransformer(**{**small, "window_size": 3})
    with pytest.raises(ValueError, match=r"unknown config key model.cfg.qk_scale"):
        SwinTransformerV2(cfg={**small, "qk_scale": None})  # v2 has no qk_scale, as LiBai


LIBAI_FILES = sorted(
    str(p.relative_to(LIBAI_MODELS))
    for d in ("swin", "swinv2")
    for p in (LIBAI_MODELS / d).glob("*.py")
)


@pytest.mark.parametrize("name", LIBAI_FILES)
def test_libai_config_files_build_and_run(name):
    """LiBai's own model config files (unmodified fixtures) instantiate with tiny sizes and
    run a training and an evaluation forward: every key they carry is accepted and taken."""
    dist.setup_dist_util({})
    cfg = LazyConfig.load(str(LIBAI_MODELS / name))
    keys = dict(cfg.model.cfg)
    tiny = dict(img_size=32, embed_dim=24, depths=[2, 2, 2, 2], window_size=4, num_classes=10)
    cfg.model.cfg.update(tiny)
    model = instantiate(cfg.model)
    assert type(model) is (SwinTransformerV2 if name.startswith("swinv2") else SwinTransformer)
    for key, value in {**keys, **tiny}.items():  # every LiBai key reached the model
        assert model.libai_cfg[key] == value, key
    last = model.layers[-1].blocks["7"]
    assert last.drop_path.drop_prob == pytest.approx(keys["drop_path_rate"])
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    model.train()
    assert model(images, labels)["losses"].requires_grad
    model.eval()
    assert model(images)["prediction_scores"].shape == (2, 10)
