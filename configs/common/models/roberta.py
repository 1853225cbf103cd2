"""RoBERTa-base with the masked-LM head. In an experiment config:
``from .common.models.roberta import cfg, model`` and change ``model.cfg.*``.

``pad_token_id`` must be the tokenizer's ``<pad>`` id: positions are counted past padding
from ``pad_token_id + 1``, so ``max_position_embeddings`` must be at least
``max_seq_length + pad_token_id + 1`` (514 for 512 tokens). ``RobertaForCausalLM`` takes the
same ``cfg``. To start from a Hugging Face checkpoint::

    from libai.models.utils import load_huggingface
    model = LazyCall(load_huggingface)(path="/models/roberta-base")
"""

from libai.config import LazyCall
from libai.models import RobertaForPreTraining

cfg = dict(
    vocab_size=50265,
    hidden_size=768,
    hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=514,
    num_tokentypes=1,
    initializer_range=0.02,
    layernorm_eps=1e-5,
    activation="gelu",
    pad_token_id=1,
)

model = LazyCall(RobertaForPreTraining)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict); on the command line override `model.cfg.*`.
cfg = model.cfg
