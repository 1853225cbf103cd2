"""Export a trained SimCSE model as a Hugging Face ``BertModel`` directory (one process).

    python projects/simcse/export_hf.py --config-file output/simcse_sup/config.yaml \\
        --checkpoint output/simcse_sup/model_best --output simcse-bert

writes ``config.json``, ``model.safetensors`` and the tokenizer's vocabulary. What gives the
sentence embedding in transformers then is what SimCSE used in evaluation:

* ``mlp="always"`` (supervised): the MLP becomes BERT's pooler (the same ``dense -> tanh`` on
  ``[CLS]``), so the embedding is ``pooler_output``;
* ``mlp="train_only"`` / ``"none"``: no pooler is written; the embedding is
  ``last_hidden_state[:, 0]`` (``pooling="cls"``) or the mean over the real tokens
  (``pooling="mean"``).
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from libai import dist  # noqa: E402
from libai.checkpoint.checkpointer import Checkpointer  # noqa: E402
from libai.config import LazyConfig, instantiate  # noqa: E402
from libai.engine import DefaultTrainer  # noqa: E402
from libai.models import BertModel  # noqa: E402
from libai.models.utils import save_huggingface  # noqa: E402


def hf_encoder(model) -> BertModel:
    """A ``BertModel`` holding ``model``'s encoder, and its MLP as BERT's pooler when the
    SimCSE embedding uses the MLP (``mlp="always"``)."""
    with_pooler = model.mlp_mode == "always"
    if with_pooler and model.pooling != "cls":
        raise ValueError(
            "pooling='mean' with mlp='always' has no Hugging Face BertModel counterpart (BERT's "
            "pooler reads [CLS]); export a model trained with pooling='cls' or mlp='train_only'."
        )
    encoder = BertModel(cfg={**model.bert.libai_cfg, "add_pooling_layer": with_pooler})
    state = dict(model.bert.state_dict())
    if with_pooler:
        state.update({f"pooler.dense.{k}": v for k, v in model.mlp.state_dict().items()})
    encoder.load_state_dict(state)  # strict: every tensor is accounted for
    return encoder


def export(config_file: str, checkpoint: str, output: str) -> None:
    """Build the run's model from its ``config.yaml``, load ``checkpoint`` and write the
    Hugging Face directory ``output`` (with the tokenizer's vocabulary)."""
    cfg = LazyConfig.load(config_file)
    dist.setup_dist_util({})
    tokenizer = DefaultTrainer.build_tokenizer(cfg)  # also sets the vocab size as in training
    model = instantiate(cfg.model)
    Checkpointer(model).load(checkpoint, checkpointables=[])
    save_huggingface(hf_encoder(model), output)
    if tokenizer is not None:
        tokenizer.save_vocabulary(output)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-file", required=True, help="the run's config.yaml")
    parser.add_argument("--checkpoint", required=True, help="e.g. output/simcse_sup/model_best")
    parser.add_argument("--output", required=True, help="the Hugging Face directory to write")
    args = parser.parse_args(argv)
    export(args.config_file, args.checkpoint, args.output)
    print(f"wrote Hugging Face directory {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
