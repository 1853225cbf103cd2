"""RoBERTa's tokenizer: GPT-2's byte-level BPE with BERT-like special tokens.

Built on :func:`libai.tokenizer.tokenization_gpt2.byte_level_bpe`; the special tokens are
``<s>`` (bos / cls), ``</s>`` (eos / sep, also ``eod``), ``<pad>``, ``<unk>`` and ``<mask>``,
and ``encode(text, add_special_tokens=True)`` frames the ids as ``<s> x </s>`` like
``transformers.RobertaTokenizer``.
"""

from __future__ import annotations

from tokenizers import processors

from libai.tokenizer.tokenization_base import BaseTokenizer, add_special_tokens
from libai.tokenizer.tokenization_gpt2 import byte_level_bpe


class RobertaTokenizer(BaseTokenizer):
    """Byte-level BPE tokenizer (RoBERTa's) built from a vocab and a merges file.

    Args:
        vocab_file: ``vocab.json``, a JSON object token -> id.
        merges_file: ``merges.txt``, one merge per line.
        bos_token, eos_token, sep_token, cls_token, unk_token, pad_token, mask_token: the
            special tokens; each must be in the vocab. They are matched whole in raw text.
        add_prefix_space: treat the text as if it started with a space (RoBERTa: ``False``).
        trim_offsets: passed to the ``<s> x </s>`` post-processor (offsets only, not ids).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        ValueError: a file cannot be parsed, or a special token is not in the vocab.
    """

    vocab_files_names = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}

    def __init__(
        self,
        vocab_file,
        merges_file,
        bos_token: str = "<s>",
        eos_token: str = "</s>",
        sep_token: str = "</s>",
        cls_token: str = "<s>",
        unk_token: str = "<unk>",
        pad_token: str = "<pad>",
        mask_token: str = "<mask>",
        add_prefix_space: bool = False,
        trim_offsets: bool = True,
    ):
        self._init_args = {
            "vocab_file": vocab_file,
            "merges_file": merges_file,
            "bos_token": bos_token,
            "eos_token": eos_token,
            "sep_token": sep_token,
            "cls_token": cls_token,
            "unk_token": unk_token,
            "pad_token": pad_token,
            "mask_token": mask_token,
            "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets,
        }
        tokenizer = byte_level_bpe(vocab_file, merges_file, add_prefix_space, "RobertaTokenizer")
        self._tokenizer = tokenizer
        self.vocab_file, self.merges_file = str(vocab_file), str(merges_file)
        self.add_prefix_space = add_prefix_space
        self._set_special_tokens(
            bos_token=bos_token,
            eos_token=eos_token,
            sep_token=sep_token,
            cls_token=cls_token,
            unk_token=unk_token,
            pad_token=pad_token,
            mask_token=mask_token,
        )
        add_special_tokens(tokenizer, self.all_special_tokens)
        tokenizer.post_processor = processors.RobertaProcessing(
            (sep_token, self.sep_token_id),
            (cls_token, self.cls_token_id),
            trim_offsets=trim_offsets,
            add_prefix_space=add_prefix_space,
        )
