"""Llama (2/3-style) causal LM. In an experiment config: ``from .common.models.llama import
model`` and change ``model.cfg.*``, e.g. ``model.cfg.hidden_layers=8`` on the command line.

The defaults are Llama-2-7B's shapes. Qwen2 is the same model with ``model_type="qwen2"`` and
``qkv_bias=True``; Llama 3 sets ``rope_theta=500000.0``, ``num_key_value_heads=8`` and
``rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
high_freq_factor=4.0, original_max_position_embeddings=8192)``.

To start from a Hugging Face checkpoint instead of random weights, replace the model with the
loader (config.json decides the shapes, ``libai_cfg`` / keyword overrides the rest)::

    from libai.models.utils import load_huggingface
    model = LazyCall(load_huggingface)(path="/models/Llama-3.2-1B")
"""

from libai.config import LazyCall
from libai.models import LlamaForCausalLM

cfg = dict(
    model_type="llama",
    hidden_layers=32,
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_attention_heads=32,
    num_key_value_heads=32,
    head_dim=None,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    initializer_range=0.02,
    rope_theta=10000.0,
    rope_scaling=None,
    attention_bias=False,
    qkv_bias=False,
    mlp_bias=False,
    attention_dropout_prob=0.0,
    tie_word_embeddings=False,
    # tokens per chunk of the training loss (LM head + cross entropy without the whole
    # [tokens, vocab] logits at once, libai.layers.chunked_lm_loss); None = the plain loss
    loss_chunk_size=None,
)

model = LazyCall(LlamaForCausalLM)(cfg=cfg)
# `cfg` IS `model.cfg` (LazyCall copied the dict), so a config file that imports both and
# edits `cfg` changes the model. On the command line, override `model.cfg.*`.
cfg = model.cfg
