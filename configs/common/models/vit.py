"""ViT-B/16 (86M) for 224 x 224 ImageNet classification. In an experiment config:
``from .common.models.vit import model`` and change ``model.cfg.*``, e.g.
``model.cfg.depth=6`` on the command line."""

from libai.config import LazyCall
from libai.models import VisionTransformer

cfg = dict(
    img_size=224,
    patch_size=16,
    in_chans=3,
    embed_dim=768,
    depth=12,
    num_heads=12,
    mlp_ratio=4.0,
    drop_rate=0.0,
    attn_drop_rate=0.0,
    drop_path_rate=0.0,
    num_classes=1000,
    loss_func=None,
    layernorm_epsilon=1e-6,
    qkv_bias=True,
    initializer_range=0.02,
)

model = LazyCall(VisionTransformer)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict), so a config file that imports both and
# edits `cfg` changes the model. On the command line, override `model.cfg.*`.
cfg = model.cfg
