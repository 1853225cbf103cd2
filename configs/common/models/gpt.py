"""GPT-2 small (124M). In an experiment config: ``from .common.models.gpt import model`` and
change ``model.cfg.*``, e.g. ``model.cfg.hidden_layers=6`` on the command line."""

from libai.config import LazyCall
from libai.models import GPTForPreTraining

cfg = dict(
    hidden_layers=12,
    vocab_size=50257,
    hidden_size=768,
    ffn_hidden_size=3072,
    num_attention_heads=12,
    max_seq_length=1024,
    embedding_dropout_prob=0.1,
    attention_dropout_prob=0.1,
    output_dropout_prob=0.1,
    layernorm_epsilon=1e-5,
    initializer_range=0.02,
    # tokens per chunk of the training loss (LM head + cross entropy without the whole
    # [tokens, vocab] logits at once, libai.layers.chunked_lm_loss); None = the plain loss
    loss_chunk_size=None,
)

model = LazyCall(GPTForPreTraining)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict), so a config file that imports both and
# edits `cfg` changes the model. On the command line, override `model.cfg.*`.
cfg = model.cfg
