"""T5-base v1.0 (220M: relu MLP, LM head tied to the embedding). In an experiment config:
``from .common.models.t5 import cfg, model`` and change ``cfg.*``, e.g. T5 v1.1 / mT5 with
``cfg.feed_forward_proj = "gated-gelu"`` and ``cfg.tie_word_embeddings = False`` (and
``cfg.model_type = "mt5"`` to export as mT5)."""

from libai.config import LazyCall
from libai.models import T5ForPreTraining

cfg = dict(
    vocab_size=32128,
    hidden_size=768,
    hidden_layers=12,  # encoder layers
    num_decoder_layers=12,
    num_attention_heads=12,
    head_size=64,
    ffn_hidden_size=3072,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_prob=0.1,
    layernorm_epsilon=1e-6,
    initializer_factor=1.0,
    feed_forward_proj="relu",
    tie_word_embeddings=True,
    scale_decoder_outputs=None,  # None = scale when tied (T5's convention)
    model_type="t5",
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

model = LazyCall(T5ForPreTraining)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict), so a config file that imports both and
# edits `cfg` changes the model. On the command line, override `model.cfg.*`.
cfg = model.cfg
