"""Tokenizers: GPT-2 byte-level BPE (through the ``tokenizers`` library) and the config builder."""

from libai.tokenizer.build import build_tokenizer
from libai.tokenizer.tokenization_gpt2 import GPT2Tokenizer

__all__ = ["GPT2Tokenizer", "build_tokenizer"]
