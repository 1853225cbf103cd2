"""FleetX's ViT YAML (tests/fixtures/fleetx, byte for byte) through GeneralClsModule on the
zoo's VisionTransformer, shrunk by ``-o``: FleetX's GeneralClsDataset and transform ops on
local images, ViTCELoss and TopkAcc against formulas computed here, then an epoch of
training through the Engine (ViTLRScheduler)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import make_engine
from fleetx_reference import FLEETX
from PIL import Image

from libai.fleetx.yaml_config import load_yaml_config

YAML = FLEETX / "ppfleetx/configs/vis/vit/ViT_base_patch16_224_pt_in1k_2n16c_dp_fp16o2.yaml"


def test_general_cls_module_from_fleetx_vit_yaml(tmp_path):
    rng = np.random.RandomState(0)
    lines = []
    (tmp_path / "img").mkdir()
    for i in range(7):
        pixels = rng.randint(0, 255, (40 + i, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "img" / f"{i}.png")
        lines.append(f"img/{i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    data = [
        f"Data.{s}.dataset.{k}"
        for s in ("Train", "Eval")
        for k in (f"image_root={tmp_path}", f"cls_label_path={tmp_path / 'list.txt'}")
    ]
    cfg = load_yaml_config(
        YAML,
        [
            *data,
            "Global.device=cpu",
            "Global.local_batch_size=3",
            "Global.micro_batch_size=3",
            "Engine.mix_precision.enable=false",
            "Engine.num_train_epochs=1",
            "Model.model.class_num=6",
            "Model.model.drop_rate=0.0",
            "+Model.model.embed_dim=32",
            "+Model.model.depth=2",
            "+Model.model.num_heads=2",
            "Data.Train.loader.num_workers=0",
            "Data.Eval.loader.num_workers=0",
            f"Engine.save_load.output_dir={tmp_path / 'out'}",
        ],
    )
    engine = make_engine(cfg)
    model = engine.module.model
    results = engine.evaluate()
    # reference: the eval images through the model; CELoss per batch of 3 and top-k by hand
    samples = [engine.valid_loader.dataset[i] for i in range(7)]
    assert samples[0]["images"].shape == (3, 224, 224)
    images = torch.stack([s["images"] for s in samples])
    labels = torch.tensor([s["labels"] for s in samples])
    with torch.no_grad():
        model.eval()
        logits = model(images)["logits"]
    batches = [slice(0, 3), slice(3, 6), slice(6, 7)]
    ce = [float(-torch.log_softmax(logits[b], -1)[range(len(labels[b])), labels[b]].mean())
          for b in batches]  # fmt: skip
    assert results["loss"] == pytest.approx(sum(ce) / len(ce), rel=1e-5)
    ranks = (logits > logits.gather(1, labels[:, None])).sum(-1)  # classes scored higher
    assert results["top1"] == pytest.approx(float((ranks < 1).float().mean()))
    assert results["top5"] == pytest.approx(float((ranks < 5).float().mean()))
    # ViTCELoss (epsilon 1e-4): sigmoid cross entropy against ViT-smoothed one-hot labels
    model.train()
    batch = {"images": images[:3], "labels": labels[:3]}
    eps = 0.0001
    with torch.no_grad():
        x = model(images[:3])["logits"]
        target = torch.full_like(x, eps)
        target[range(3), labels[:3]] = 1.0
        p = torch.sigmoid(x)
        expected = -(target * p.log() + (1 - target) * (1 - p).log()).sum(-1).mean()
        got = engine.module.training_step(batch)
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    engine.fit()
    assert engine.trainer.iter == 7 // 3
