"""BERT's WordPiece tokenizer on ``vocab.txt``, via the ``tokenizers`` library.

The pipeline of Google's BERT and Hugging Face's ``BertTokenizer``: ``BertNormalizer``
(clean control characters, space out CJK characters, optionally lower-case and strip
accents), ``BertPreTokenizer`` (split on whitespace and punctuation), greedy longest-match
WordPiece with ``##`` continuation pieces, and ``[CLS] x [SEP]`` framing when asked for.
"""

from __future__ import annotations

import logging

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from libai.tokenizer.chinese_wwm import (
    CJK_RUN,
    clean_for_segmentation,
    jieba_segmenter,
    wwm_encode,
)
from libai.tokenizer.tokenization_base import BaseTokenizer, add_special_tokens, check_file

logger = logging.getLogger(__name__)


def _read_wordpiece_vocab(vocab_file: str) -> dict[str, int]:
    """``vocab.txt``: one token per line, the id is the line number (as in ``transformers``)."""
    vocab = {}
    with open(vocab_file, encoding="utf-8") as f:
        for index, line in enumerate(f):
            vocab[line.rstrip("\n")] = index
    return vocab


class BertTokenizer(BaseTokenizer):
    """WordPiece tokenizer (BERT's) built from a ``vocab.txt``.

    Args:
        vocab_file: ``vocab.txt``, one token per line.
        do_lower_case: lower-case the text (and strip accents unless ``strip_accents=False``).
        unk_token, sep_token, pad_token, cls_token, mask_token: the special tokens; each must
            be in the vocab. They are matched whole in raw text (``"[MASK]"``), never split.
        tokenize_chinese_chars: put spaces around CJK characters (one token each).
        strip_accents: strip accents; ``None`` follows ``do_lower_case`` (as in BERT).
        do_chinese_wwm: LiBai's Chinese whole-word segmentation (jieba; see
            :mod:`libai.tokenizer.chinese_wwm`): a Chinese word's later characters are
            ``##`` pieces, for ``masking_style="bert-cn-wwm"``. jieba is imported when
            Chinese text is encoded (an ImportError naming ``pip install jieba`` if missing).
        bos_token, eos_token, additional_special_tokens: LiBai's extra special tokens (its T5
            config's ``[BOS]``, ``[EOS]``, ``<extra_id_i>``); those missing from the vocab are
            appended to it, as LiBai's ``add_special_tokens`` does. With an ``eos_token`` it
            is also ``eod``.

    ``encode(text)`` gives the WordPiece ids alone (what ``tools/preprocess_data.py`` stores);
    ``encode(text, add_special_tokens=True)`` gives ``[CLS] ids [SEP]`` like
    ``transformers.BertTokenizer.encode``. BERT has no end-of-document token: ``eod`` is
    ``None`` (the ``eos_token`` when one is given); ids are also under Megatron's names ``cls``, ``sep``, ``pad``, ``mask``, ``unk``.

    Raises:
        FileNotFoundError: ``vocab_file`` is missing (the message names it).
        ValueError: a special token is not in the vocab.
    """

    vocab_files_names = {"vocab_file": "vocab.txt"}

    def __init__(
        self,
        vocab_file,
        do_lower_case: bool = True,
        unk_token: str = "[UNK]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        mask_token: str = "[MASK]",
        tokenize_chinese_chars: bool = True,
        strip_accents: bool | None = None,
        do_chinese_wwm: bool = False,
        bos_token: str | None = None,
        eos_token: str | None = None,
        additional_special_tokens=(),
    ):
        additional_special_tokens = list(additional_special_tokens or ())
        self._init_args = {
            "vocab_file": vocab_file,
            "do_lower_case": do_lower_case,
            "unk_token": unk_token,
            "sep_token": sep_token,
            "pad_token": pad_token,
            "cls_token": cls_token,
            "mask_token": mask_token,
            "tokenize_chinese_chars": tokenize_chinese_chars,
            "strip_accents": strip_accents,
            "do_chinese_wwm": do_chinese_wwm,
            "bos_token": bos_token,
            "eos_token": eos_token,
            "additional_special_tokens": additional_special_tokens,
        }
        self.vocab_file = check_file(
            vocab_file, "vocab_file", "BertTokenizer", "a BERT vocab.txt (one token per line)"
        )
        self.do_lower_case = do_lower_case
        self._strips_accents = do_lower_case if strip_accents is None else bool(strip_accents)
        self.do_chinese_wwm = bool(do_chinese_wwm)
        self._segment = None  # jieba, imported on the first Chinese text
        vocab = _read_wordpiece_vocab(self.vocab_file)
        if unk_token not in vocab:
            raise ValueError(
                f"BertTokenizer unk_token={unk_token!r} is not in the vocabulary of "
                f"{self.vocab_file}; WordPiece needs it for words it cannot split."
            )
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk_token))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,
            lowercase=do_lower_case,
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        self._tokenizer = tokenizer
        # LiBai's extra special tokens: appended to the vocab when missing
        add_special_tokens(tokenizer, [bos_token, eos_token, *additional_special_tokens])
        self._set_special_tokens(
            additional_special_tokens,
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            sep_token=sep_token,
            pad_token=pad_token,
            cls_token=cls_token,
            mask_token=mask_token,
        )
        add_special_tokens(tokenizer, self.all_special_tokens)
        cls_id, sep_id = self.cls_token_id, self.sep_token_id
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls_token}:0 $A:0 {sep_token}:0",
            pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
            special_tokens=[(cls_token, cls_id), (sep_token, sep_id)],
        )

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if not (self.do_chinese_wwm and CJK_RUN.search(text)):
            return super()._encode(text, add_special_tokens)
        if self._segment is None:
            self._segment = jieba_segmenter()
        ids = wwm_encode(
            clean_for_segmentation(text, self._strips_accents),
            self._segment,
            lambda part: super(BertTokenizer, self)._encode(part, False),
            self._tokenizer.get_vocab(with_added_tokens=True),
            self.unk_token,
        )
        return [self.cls_token_id, *ids, self.sep_token_id] if add_special_tokens else ids

    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        if not self.do_chinese_wwm:
            return super()._encode_batch(texts, add_special_tokens)
        return [self._encode(t, add_special_tokens) for t in texts]

    def _tokenize(self, text: str) -> list[str]:
        if not (self.do_chinese_wwm and CJK_RUN.search(text)):
            return super()._tokenize(text)
        return self.convert_ids_to_tokens(self._encode(text, False))
