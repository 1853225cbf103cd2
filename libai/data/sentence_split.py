"""A small rule-based sentence splitter for ``tools/preprocess_data.py --split-sentences``.

BERT-style datasets need documents made of sentences. Megatron and LiBai split with NLTK's
punkt model, which is not available here, so this splitter uses rules instead:

- every line break ends a sentence (one sentence per line is a common corpus layout);
- ``.``, ``!``, ``?`` or ``…`` (with any closing quotes / brackets after them) end a sentence
  when whitespace and then an uppercase letter, a digit or an opening quote / bracket follow,
  except after a known abbreviation (``Mr.``, ``Dr.``, ``e.g.``, ...) or a single letter
  (an initial, ``J. Smith``);
- the full-width ``。``, ``！`` and ``？`` end a sentence wherever they stand.

It is a heuristic: a sentence that starts with a lower-case letter is not split off, and an
abbreviation missing from the list splits its sentence. Corpora that already hold one
sentence per line are split exactly.
"""

from __future__ import annotations

import re

__all__ = ["split_sentences"]

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al no nos fig figs vol pp ed eds inc ltd "
    "co corp dept est approx jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k".split()
)
_CLOSERS = "\"')]\u201d\u2019\u00bb\u300d\u300f"
_OPENERS = "\"'([\u201c\u2018\u00ab"
_END = re.compile(
    rf"[.!?\u2026]+[{re.escape(_CLOSERS)}]*(?=\s)|[\u3002\uff01\uff1f]+[{re.escape(_CLOSERS)}]*"
)
_LAST_WORD = re.compile(r"(\S+)$")


def _ends_sentence(line: str, match: re.Match) -> bool:
    mark = match.group()
    if mark[0] in "\u3002\uff01\uff1f":
        return True
    rest = line[match.end() :].lstrip()
    if not rest:
        return True
    if not (rest[0].isupper() or rest[0].isdigit() or rest[0] in _OPENERS):
        return False
    if mark.rstrip(_CLOSERS) == ".":
        word = _LAST_WORD.search(line, 0, match.start())
        word = word.group(1).lower() if word else ""
        if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
            return False
    return True


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped of surrounding whitespace; empty ones are dropped."""
    sentences = []
    for line in text.splitlines():
        start = 0
        for match in _END.finditer(line):
            if _ends_sentence(line, match):
                sentences.append(line[start : match.end()].strip())
                start = match.end()
        sentences.append(line[start:].strip())
    return [s for s in sentences if s]
