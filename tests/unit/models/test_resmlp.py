"""LiBai's ResMLP against an independent plain-PyTorch ResMLP written here from the paper's
equations (arXiv:2105.03404) on the same random weights: logits equal in fp32, the loss
(cross entropy and soft targets), LiBai's config keys, and its errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from resmlp_reference import reference_logits

from libai.config import LazyCall, instantiate
from libai.layers.soft_target_cross_entropy import SoftTargetCrossEntropy
from libai.models import ResMLP

# LiBai's configs/common/models/resmlp/resmlp_12.py keys, tiny sizes
CFG = dict(
    img_size=16,
    patch_size=4,
    in_chans=3,
    embed_dim=12,
    depth=2,
    drop_rate=0.0,
    drop_path_rate=0.0,
    init_scale=0.1,
    num_classes=5,
    loss_func=None,
)


@pytest.fixture(scope="module")
def model_and_weights():
    torch.manual_seed(0)
    model = instantiate(LazyCall(ResMLP)(cfg=DictConfig(CFG)))
    with torch.no_grad():  # random values everywhere (alpha, beta, gamma included)
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, weights


def test_resmlp_logits_equal_the_equations(model_and_weights):
    model, weights = model_and_weights
    assert sum(k.endswith(("gamma_1", "gamma_2")) for k in weights) == 4
    images = torch.randn(3, 3, 16, 16)
    model.eval()
    got = model(images)["logits"]
    want = reference_logits(weights, images, depth=2, patch=4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    labels = torch.tensor([0, 4, 2])
    model.train()
    torch.testing.assert_close(
        model(images, labels)["loss"], F.cross_entropy(want, labels), rtol=1e-5, atol=1e-6
    )


def test_resmlp_soft_targets_init_and_errors():
    node = LazyCall(ResMLP)(cfg=DictConfig({**CFG, "init_scale": 1e-5}))
    node.cfg.loss_func = SoftTargetCrossEntropy()  # as LiBai's resmlp_imagenet.py does
    torch.manual_seed(1)
    model = instantiate(node)
    # LiBai's init: layer scales at init_scale, affines at identity
    assert torch.equal(model.blocks["1"].gamma_2, torch.full((12,), 1e-5))
    assert torch.equal(model.norm.alpha, torch.ones(12)) and torch.equal(
        model.norm.beta, torch.zeros(12)
    )
    images, target = torch.randn(2, 3, 16, 16), torch.rand(2, 5).softmax(-1)
    logits = model(images)["logits"]
    want = -(target * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(model(images, target)["loss"], want)
    with pytest.raises(ValueError, match=r"expects images \[batch, 3, 16, 16\]"):
        model(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="img_size=16 is not divisible by patch_size=5"):
        ResMLP(**{**CFG, "patch_size": 5})


def test_resmlp_config_weight_decay_overrides_reach_affines_and_layer_scales(model_and_weights):
    """resmlp_imagenet.py's ``optim.params.overrides`` (alpha, beta, gamma_1, gamma_2 without
    weight decay) name ResMLP's parameters: exactly those get weight_decay 0."""
    from libai.optim import get_default_optimizer_params

    model, _ = model_and_weights
    overrides = {k: {"weight_decay": 0.0} for k in ("alpha", "beta", "gamma_1", "gamma_2")}
    groups = get_default_optimizer_params(model, weight_decay=0.2, overrides=overrides)
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    for name, param in model.named_parameters():
        last = name.rsplit(".", 1)[-1]
        assert (id(param) in no_decay) == (last in overrides or last == "bias"), name
