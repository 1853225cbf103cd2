"""FleetX's own GPT YAMLs (tests/fixtures/fleetx, byte for byte) shrunk by ``-o`` to CPU
sizes, a tiny tokenizer and Hugging Face GPT-2 to run them with, and FleetX's corpus
format written as FleetX's preprocess_data.py writes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fleetx_reference import FLEETX, write_fleetx_corpus

GPT_CONFIGS = FLEETX / "ppfleetx" / "configs" / "nlp" / "gpt"
VOCAB = 512
#: sizes, device and precision: the 345M files as a 2-layer GPT of width 32 in fp32 on CPU
TINY = [
    "Global.device=cpu",
    "Global.local_batch_size=2",
    "Global.micro_batch_size=2",
    f"Model.vocab_size={VOCAB}",
    "Model.hidden_size=32",
    "Model.num_layers=2",
    "Model.num_attention_heads=2",
    "Model.ffn_hidden_size=64",
    "Model.max_position_embeddings=64",
    "Model.hidden_dropout_prob=0.0",
    "Model.attention_probs_dropout_prob=0.0",
    "Engine.mix_precision.enable=false",
]


def tokenizer_overrides(tokenizer_dir: Path) -> list[str]:
    """``Model.tokenizer`` (this library's key: FleetX downloads GPT-2's) = a tiny BPE."""
    from bpe_helpers import train_tiny_bpe

    vocab, merges = train_tiny_bpe(tokenizer_dir)
    return [f"+Model.tokenizer.vocab_file={vocab}", f"+Model.tokenizer.merges_file={merges}"]


def tiny_hf_gpt2(path: Path, seed: int = 0):
    """A random GPT-2 of the TINY sizes saved in ``path``; returns the model (eval mode)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    return model


def fleetx_corpus(root: Path, num_docs: int = 1000, seed: int = 3) -> Path:
    """``num_docs`` items of 4..12 tokens (< VOCAB) in FleetX's format under ``root``."""
    rng = np.random.RandomState(seed)
    docs = [list(rng.randint(1, 300, size=rng.randint(4, 13))) for _ in range(num_docs)]
    root.mkdir(parents=True, exist_ok=True)
    write_fleetx_corpus(str(root / "corpus"), docs)
    return root


def eval_layout_config(base: list[str], out_dir, overrides: list[str]):
    """FleetX's pretrain_gpt_345M_single_card.yaml for an evaluation: ``base`` (sizes,
    tokenizer, corpus), the layout ``overrides``, output under ``out_dir``."""
    from libai.fleetx.yaml_config import load_yaml_config

    return load_yaml_config(
        GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
        [*base, f"Engine.save_load.output_dir={out_dir}", *overrides],
    )


def write_sst2(root: Path, rows: list[tuple[str, int]]) -> Path:
    """GLUE's SST-2 files (``sentence<TAB>label`` with a header) for train and dev."""
    root.mkdir(parents=True, exist_ok=True)
    body = "sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows)
    for split in ("train", "dev"):
        (root / f"{split}.tsv").write_text(body)
    return root
