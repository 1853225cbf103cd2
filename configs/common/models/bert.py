"""BERT-base with the pretraining heads (masked LM + next sentence). In an experiment config:
``from .common.models.bert import cfg, model`` and change ``model.cfg.*``, e.g.
``model.cfg.hidden_layers=6`` on the command line.

``BertForClassification`` takes the same ``cfg`` plus ``num_labels`` (and optionally
``classifier_dropout``). To start from a Hugging Face checkpoint instead of random weights::

    from libai.models.utils import load_huggingface
    model = LazyCall(load_huggingface)(path="/models/bert-base-uncased")
"""

from libai.config import LazyCall
from libai.models import BertForPreTraining

cfg = dict(
    vocab_size=30522,
    hidden_size=768,
    hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    num_tokentypes=2,
    initializer_range=0.02,
    layernorm_eps=1e-12,
    activation="gelu",
    pad_token_id=0,
)

model = LazyCall(BertForPreTraining)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict), so a config file that imports both and
# edits `cfg` changes the model. On the command line, override `model.cfg.*`.
cfg = model.cfg
