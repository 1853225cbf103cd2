"""Tiny random generative Hugging Face models (GPT-2, Llama with GQA, T5) with locally
trained tokenizers, saved to directories, for the generation tests (in-process and under
torchrun)."""

from __future__ import annotations

from pathlib import Path

import torch
from inference_helpers import CORPUS

KINDS = ("gpt2", "llama", "t5")
PROMPTS = ["the quick brown fox", "hello", "paris is the capital of france and the"]


def _byte_level_tokenizer(specials: list[str], bos: str | None):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on CORPUS (+ ``bos`` prepended)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=160,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


def make_gpt2_dir(root: Path) -> str:
    import transformers

    tok = _byte_level_tokenizer(["<|endoftext|>"], None)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        n_embd=32,
        n_layer=4,
        n_head=4,
        initializer_range=0.3,  # peaked predictions: no near-ties between candidates
        bos_token_id=eos,
        eos_token_id=eos,
    )
    out = root / "gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(out)
    fast.save_pretrained(out)
    return str(out)


def make_llama_dir(root: Path) -> str:
    import transformers

    tok = _byte_level_tokenizer(["<unk>", "<s>", "</s>"], "<s>")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.3,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
    )
    out = root / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    fast.save_pretrained(out)
    return str(out)


def train_spiece(directory: Path) -> None:
    """A unigram ``spiece.model`` of T5's special ids (pad 0, eos 1, unk 2) trained on CORPUS."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(Path(directory) / "spiece"),
        model_type="unigram",
        vocab_size=120,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )


def make_t5_dir(root: Path) -> str:
    import transformers

    out = root / "t5"
    out.mkdir(parents=True, exist_ok=True)
    train_spiece(out)
    tokenizer = transformers.T5Tokenizer.from_pretrained(out, extra_ids=0)
    torch.manual_seed(2)
    config = transformers.T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        initializer_factor=3.0,
    )
    transformers.T5ForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def make_generation_dirs(root) -> dict[str, str]:
    """``{"gpt2": dir, "llama": dir, "t5": dir}`` under ``root``."""
    root = Path(root)
    return {"gpt2": make_gpt2_dir(root), "llama": make_llama_dir(root), "t5": make_t5_dir(root)}


def load_tiny_gpt2(root: Path):
    """``make_gpt2_dir(root)`` loaded both ways: its transformers model (eval) and tokenizer,
    and a libai ``ModelStepper`` on the same weights (the caller sets up the mesh first)."""
    from types import SimpleNamespace

    import transformers

    from libai.inference.generation import ModelStepper
    from libai.models.utils import load_huggingface

    path = make_gpt2_dir(root)
    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    stepper = ModelStepper(load_huggingface(path).eval())
    return SimpleNamespace(path=path, hf=hf, tok=tok, stepper=stepper)


def random_prompts(vocab: int, seed: int, shape=(2, 5)) -> torch.Tensor:
    """Seeded random prompt ids (no special ids 0-2), ``shape`` = (batch, length)."""
    return torch.randint(3, vocab, shape, generator=torch.Generator().manual_seed(seed))
