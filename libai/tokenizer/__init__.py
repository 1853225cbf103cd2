"""Tokenizers wrapping maintained libraries (``tokenizers``, ``sentencepiece``), and the builder.

- :class:`GPT2Tokenizer`: GPT-2 byte-level BPE (``vocab.json`` + ``merges.txt``)
- :class:`RobertaTokenizer`: RoBERTa byte-level BPE with ``<s> </s> <pad> <unk> <mask>``
- :class:`BertTokenizer`: BERT WordPiece (``vocab.txt``)
- :class:`T5Tokenizer`: T5 sentencepiece (``spiece.model``) with ``<extra_id_*>`` sentinels
- :class:`JsonTokenizer`: any Hugging Face ``tokenizer.json`` (Llama, Qwen2, ...)
- :class:`PreTrainedTokenizer`: LiBai's slow base class for tokenizers written in Python

All share :class:`BaseTokenizer`'s API and give the same ids as ``transformers``.
"""

from libai.tokenizer.build import build_tokenizer
from libai.tokenizer.tokenization_base import BaseTokenizer
from libai.tokenizer.tokenization_bert import BertTokenizer
from libai.tokenizer.tokenization_gpt2 import GPT2Tokenizer
from libai.tokenizer.tokenization_hf import JsonTokenizer
from libai.tokenizer.tokenization_pretrained import PreTrainedTokenizer
from libai.tokenizer.tokenization_roberta import RobertaTokenizer
from libai.tokenizer.tokenization_t5 import T5Tokenizer

__all__ = [
    "BaseTokenizer",
    "BertTokenizer",
    "GPT2Tokenizer",
    "JsonTokenizer",
    "PreTrainedTokenizer",
    "RobertaTokenizer",
    "T5Tokenizer",
    "build_tokenizer",
]
