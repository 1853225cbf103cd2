"""LiBai's Chinese whole-word pre-segmentation for ``BertTokenizer(do_chinese_wwm=True)``.

A run of Chinese characters is cut into words by ``jieba`` (``jieba.lcut(run, HMM=False)``, as
LiBai); a word becomes its first character and ``##``-prefixed continuation characters
(``中国 -> 中 ##国``), so the masking of ``masking_style="bert-cn-wwm"``
(:mod:`libai.data.datasets.lm_masking`) masks whole words. A continuation piece is chosen when
the piece without ``##`` is in the vocabulary; its id is that of the ``##`` token (``[UNK]``
if the vocabulary lacks it), as LiBai's WordPiece does. Text outside Chinese runs goes through
the ordinary BERT pipeline.

``jieba`` is imported only when Chinese text is encoded, so a config that names
``do_chinese_wwm=True`` trains from preprocessed data without it.
"""

from __future__ import annotations

import re
import unicodedata

#: CJK unified ideographs and their extensions / compatibility blocks (BERT's definition)
_CJK = (
    "\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff"
    "\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f"
)
CJK_RUN = re.compile(f"[{_CJK}]+")
#: the characters whose continuation pieces get ``##`` (LiBai's ``_is_chinese_substr``)
_CHINESE_SUBSTR = re.compile("[\u4e00-\u9fa5]")


def jieba_segmenter():
    """``text -> list of words`` with jieba, or an ImportError saying how to install it."""
    try:
        import jieba
    except ImportError as e:
        raise ImportError(
            "BertTokenizer(do_chinese_wwm=True) / --do-chinese-wwm segments Chinese words with "
            "jieba (LiBai's Chinese whole-word masking), which is not installed: "
            "pip install jieba"
        ) from e
    return lambda text: jieba.lcut(text, HMM=False)


def clean_for_segmentation(text: str, strip_accents: bool) -> str:
    """``text`` as BERT's normalizer cleans it, before jieba sees the Chinese runs (as LiBai's
    ``BasicTokenizer`` cleans first): the characters it drops (NUL, U+FFFD, control and format
    characters such as a zero-width space) are gone, so they cannot split a word; with accents
    stripped, Chinese runs are NFD-normalized (a CJK compatibility ideograph becomes its
    unified one, ``\uf900 -> \u8c48``)."""
    text = "".join(
        c
        for c in text
        if c in "\t\n\r" or not (c in "\x00\ufffd" or unicodedata.category(c).startswith("C"))
    )
    if strip_accents:
        text = CJK_RUN.sub(lambda m: unicodedata.normalize("NFD", m.group()), text)
    return text


def word_pieces(word: str, vocab: dict[str, int], unk: str) -> list[str]:
    """LiBai's greedy longest-match WordPiece of one Chinese word."""
    out, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            sub = word[start:end]
            if start == 0:
                found = sub in vocab
            elif _CHINESE_SUBSTR.match(sub):
                found = sub in vocab  # the piece is written ##sub, looked up without ##
            else:
                found = "##" + sub in vocab
            if found:
                piece = sub if start == 0 else "##" + sub
                break
            end -= 1
        if piece is None:
            return [unk]
        out.append(piece)
        start = end
    return out


def wwm_encode(text: str, segment, encode_plain, vocab: dict[str, int], unk: str) -> list[int]:
    """Ids of ``text``: Chinese runs segmented into whole words, the rest by ``encode_plain``."""
    unk_id = vocab[unk]
    ids, pos = [], 0
    for match in CJK_RUN.finditer(text):
        if match.start() > pos:
            ids += encode_plain(text[pos : match.start()])
        for word in segment(match.group()):
            ids += [vocab.get(p, unk_id) for p in word_pieces(word, vocab, unk)]
        pos = match.end()
    if pos < len(text):
        ids += encode_plain(text[pos:])
    return ids
