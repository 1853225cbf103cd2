"""BertTokenizer's vocab.txt, options and special tokens, and LiBai's Chinese whole-word
segmentation (``do_chinese_wwm``), each against an independent reference:

- ``transformers``' ``BertTokenizer`` (Rust) and ``BertTokenizerLegacy`` (pure Python) built
  from the same ``vocab.txt``;
- LiBai's own WordPiece (``tests/fixtures/libai/projects/QQP/tokenizer/bert_tokenization.py``,
  unmodified), whose Chinese continuation pieces ``##c`` are looked up as ``c``;
- ids worked out by hand on a tiny vocabulary (``VOCAB`` below).

Chinese words come from jieba (``jieba.lcut(run, HMM=False)``, as LiBai). Where jieba is not
installed, a table of jieba 0.42.1's segmentations of the few texts used here stands in for it
(``JIEBA_WORDS``; checked against jieba itself where it is installed).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import signal
import sys
import types

import pytest
from locales import ascii_locale
from train_net_helpers import ROOT

from libai.data.datasets.text_classification import SampleEncoder
from libai.tokenizer import BertTokenizer
from libai.tokenizer.chinese_wwm import jieba_segmenter, word_pieces, wwm_encode

transformers = pytest.importorskip("transformers")
HAS_JIEBA = importlib.util.find_spec("jieba") is not None

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = [
    *SPECIAL,
    *["the", "fox", "x", "hello", ".", "cafe", "café", "<unk>", "你好"],
    "hello\x1f",  # ends in U+001F, whitespace to Python's str.strip() but not to transformers
    "FOX",  # ends in X (cased)
    *"他来到了网易杭研大厦中国人我爱北京天安门你好",
    "北京",  # a whole Chinese word in the vocabulary
    *["##国", "##人", "##易", "##厦", "##安", "##门", "##好"],  # no ##到: its id is [UNK]'s
    "\u8c48",  # the unified ideograph of the compatibility ideograph U+F900
]
ID = {token: i for i, token in enumerate(VOCAB)}

#: jieba 0.42.1, ``jieba.lcut(run, HMM=False)`` (LiBai's call); with its HMM,
#: ``他来到了网易杭研大厦`` keeps ``杭研`` as one (new) word, as jieba's README shows
JIEBA_WORDS = {
    "他来到了网易杭研大厦": ["他", "来到", "了", "网易", "杭", "研", "大厦"],
    "中国人": ["中国", "人"],
    "我爱北京天安门": ["我", "爱", "北京", "天安门"],
    "囧": ["囧"],
}

#: text -> its whole-word-masking tokens, worked out by hand from JIEBA_WORDS and VOCAB
WWM_CASES = {
    "the 中国人 fox.": "the 中 ##国 人 fox .".split(),
    # 来到 -> 来 ##到, and ##到 is not in the vocabulary
    "x他来到了网易杭研大厦": "x 他 来 [UNK] 了 网 ##易 杭 研 大 ##厦".split(),
    # 北京 is one piece; 天安门 -> 天 ##安 ##门
    "我爱北京天安门Hello中国人": "我 爱 北京 天 ##安 ##门 hello 中 ##国 人".split(),
    "中国人": "中 ##国 人".split(),
    "the 囧 fox": "the [UNK] fox".split(),
}


def ids(tokens):
    return [ID[t] for t in tokens]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert_wwm") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def table_segmenter(run: str) -> list[str]:
    return JIEBA_WORDS[run]


@pytest.fixture(scope="module")
def segment():
    """jieba's words (LiBai's call) where jieba is installed, else its recorded words."""
    return jieba_segmenter() if HAS_JIEBA else table_segmenter


def wwm_tokenizer(vocab_file, **kwargs) -> BertTokenizer:
    tok = BertTokenizer(vocab_file, do_chinese_wwm=True, **kwargs)
    if not HAS_JIEBA:
        tok._segment = table_segmenter  # jieba's recorded words in jieba's place
    return tok


def hf_fast(vocab_file, **kwargs):
    return transformers.BertTokenizer(vocab=str(vocab_file), **kwargs)


def hf_slow(vocab_file, **kwargs):
    return transformers.BertTokenizerLegacy(vocab_file=str(vocab_file), **kwargs)


@functools.cache
def libai_bert_tokenization():
    """LiBai's own tokenizer module (QQP project's bert_tokenization.py, unmodified). The
    file's only use of ``six`` (``six.PY3`` / ``six.PY2``) is stood in for by a module saying
    Python 3 while the file is imported."""
    path = ROOT / "tests/fixtures/libai/projects/QQP/tokenizer/bert_tokenization.py"
    spec = importlib.util.spec_from_file_location("libai_qqp_bert_tokenization", path)
    module = importlib.util.module_from_spec(spec)
    six = types.ModuleType("six")
    six.PY3, six.PY2 = True, False
    saved = sys.modules.get("six")
    sys.modules["six"] = six
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["six"]
        else:
            sys.modules["six"] = saved
    return module


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (TimeoutError) instead of hanging when a loop never ends."""

    def expire(signum, frame):
        raise TimeoutError(f"no result within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- vocab.txt, options and special tokens: as transformers ------------------------------------
def test_vocab_lines_are_utf8_tokens_whatever_the_locale(vocab_file):
    """Each line is a token, only its newline dropped (``"hello\\x1f"`` is not ``hello``, ``FOX``
    keeps its ``X``), read as UTF-8 even in a POSIX locale: as both of transformers' readers."""
    hf = hf_fast(vocab_file, do_lower_case=False)
    legacy = hf_slow(vocab_file, do_lower_case=False)
    with ascii_locale():  # open()'s default encoding is ASCII now
        tok = BertTokenizer(vocab_file, do_lower_case=False)
    assert tok.get_vocab() == hf.get_vocab() == legacy.get_vocab() == ID
    text = "hello FOX 中国人 你好"
    want = ids(["hello", "FOX", "中", "国", "人", "你", "好"])
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False) == want
    assert tok.encode(text, add_special_tokens=True) == legacy.encode(text)


def test_defaults_are_berts(vocab_file):
    """Lower-cased, accents stripped, CJK characters one token each, [UNK] for the unknown."""
    tok, hf = BertTokenizer(vocab_file), hf_fast(vocab_file)
    text = "The FOX Café 你好 zzz"
    want = ids(["the", "fox", "cafe", "你", "好", "[UNK]"])
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False) == want
    assert tok.tokenize(text) == hf_slow(vocab_file).tokenize(text) == [VOCAB[i] for i in want]
    assert tok.do_lower_case is hf.do_lower_case is True
    assert BertTokenizer(vocab_file, do_lower_case=False).do_lower_case is False


@pytest.mark.parametrize(
    "options",
    [
        {"do_lower_case": True, "strip_accents": False},
        {"do_lower_case": False, "strip_accents": True},
        {"tokenize_chinese_chars": False},
        {"unk_token": "<unk>"},
    ],
)
def test_options_are_transformers(vocab_file, options):
    tok = BertTokenizer(vocab_file, **options)
    fast, legacy = hf_fast(vocab_file, **options), hf_slow(vocab_file, **options)
    for text in ["The FOX Café café", "你好 中国人 hello", "zzz the 囧", "hello\x00 fox\u200b"]:
        want = legacy.encode(text, add_special_tokens=False)
        assert tok.encode(text) == fast.encode(text, add_special_tokens=False) == want, text
        assert tok.tokenize(text) == legacy.tokenize(text), text


def test_options_worked_by_hand(vocab_file):
    assert BertTokenizer(vocab_file, strip_accents=False).encode("Café") == [ID["café"]]
    assert BertTokenizer(vocab_file, tokenize_chinese_chars=False).encode("你好") == [ID["你好"]]
    assert BertTokenizer(vocab_file, unk_token="<unk>").encode("zzz") == [ID["<unk>"]]


def test_extra_special_tokens_are_transformers(vocab_file):
    """bos / eos / additional tokens missing from vocab.txt are appended, in that order."""
    extra = {"bos_token": "[BOS]", "eos_token": "[EOS]", "additional_special_tokens": ["<x_0>"]}
    tok, hf = BertTokenizer(vocab_file, **extra), hf_fast(vocab_file, **extra)
    n = len(VOCAB)
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id) == (n, n + 1)
    assert tok.eod == n + 1
    assert tok.additional_special_tokens == ["<x_0>"] and tok.additional_special_tokens_ids == [
        n + 2
    ]
    assert tok.all_special_tokens == hf.all_special_tokens
    assert tok.all_special_ids == hf.all_special_ids
    text = "the [BOS] fox <x_0> [EOS]"
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False)
    assert tok.encode(text) == [ID["the"], n, ID["fox"], n + 2, n + 1]
    assert len(tok) == len(hf) == n + 3


def test_sentence_pairs_are_framed_as_transformers(vocab_file):
    """[CLS] a [SEP] b [SEP] with type ids 0 / 1 (the sentence-pair classification input)."""
    encoder = SampleEncoder(BertTokenizer(vocab_file), max_seq_length=12, pair=True)
    got = encoder("the fox", "你好 hello")
    want = hf_fast(vocab_file)("the fox", "你好 hello", padding="max_length", max_length=12)
    assert got["input_ids"].tolist() == want["input_ids"]
    assert got["tokentype_ids"].tolist() == want["token_type_ids"]
    assert got["input_ids"].tolist()[:9] == ids(
        ["[CLS]", "the", "fox", "[SEP]", "你", "好", "hello", "[SEP]", "[PAD]"]
    )


def test_missing_vocab_file_messages(tmp_path):
    hint = "a BERT vocab.txt (one token per line)"
    with pytest.raises(ValueError) as none:
        BertTokenizer(None)
    assert str(none.value) == (
        f"BertTokenizer needs a vocab_file (tokenization.tokenizer.vocab_file): {hint}."
    )
    missing = tmp_path / "nowhere" / "vocab.txt"
    with pytest.raises(FileNotFoundError) as absent:
        BertTokenizer(missing)
    assert str(absent.value) == (
        f"BertTokenizer vocab_file not found: {missing} does not exist. Set "
        f"tokenization.tokenizer.vocab_file (or --vocab-file) to {hint}."
    )


# ---- LiBai's Chinese WordPiece ----------------------------------------------------------------
#: U+3400.. are CJK (extension A) but not in LiBai's ``[\u4e00-\u9fa5]``: their continuation
#: pieces are looked up with their ``##``, like any non-Chinese piece
WP_VOCAB = ["[UNK]", "中", "国", "人", "中国", "国人", "大", "厦", "㐀", "##㐁", "##", "a", "##b"]
WP_WORDS = [
    *["中", "中国", "中国人", "国人", "人中国", "大厦", "厦大人", "中囧", "囧", "中国人大厦"],
    *["㐀", "㐀中", "中㐀", "中㐁", "㐁", "㐀㐁", "ab", "中b", "中国人大厦中国人大厦"],
]
WP_WANT = {  # by hand: greedy longest match; ##c is found when c (Chinese) is in WP_VOCAB
    "中国人": ["中国", "##人"],
    "人中国": ["人", "##中国"],
    "厦大人": ["厦", "##大", "##人"],
    "中囧": ["[UNK]"],
    "中㐀": ["[UNK]"],  # ##㐀 is not in WP_VOCAB
    "中㐁": ["中", "##㐁"],
    "㐁": ["[UNK]"],  # a word never starts with a ## piece
}


def test_word_pieces_are_libais_wordpiece():
    vocab = {token: i for i, token in enumerate(WP_VOCAB)}
    libai = libai_bert_tokenization().WordpieceTokenizer(vocab=vocab)
    for word in WP_WORDS:
        with deadline(2.0):
            got = word_pieces(word, vocab, "[UNK]")
        assert got == libai.tokenize(word), word
    for word, want in WP_WANT.items():
        assert word_pieces(word, vocab, "[UNK]") == want, word


def test_word_pieces_of_chinese_words_by_hand():
    vocab = {token: i for i, token in enumerate(["<u>", "天", "安", "门", "天安门广场", "##安"])}
    assert word_pieces("天安门", vocab, "<u>") == ["天", "##安", "##门"]  # no 天安门, 天安, 安门
    assert word_pieces("天安门广场", vocab, "<u>") == ["天安门广场"]
    assert word_pieces("门天", vocab, "<u>") == ["门", "##天"]
    assert word_pieces("天广", vocab, "<u>") == ["<u>"]  # 广 is unknown: the whole word is
    assert word_pieces("", vocab, "<u>") == []


# ---- LiBai's whole-word segmentation ----------------------------------------------------------
@pytest.mark.skipif(not HAS_JIEBA, reason="jieba is not installed")
def test_jieba_segmenter_is_libais_call():
    """jieba.lcut(run, HMM=False): dictionary words only (jieba's HMM would join 杭研)."""
    segment = jieba_segmenter()
    for run, words in JIEBA_WORDS.items():
        assert segment(run) == words, run


def test_wwm_encode_by_hand(vocab_file, segment):
    """Chinese runs: jieba's words as first char + ## pieces; the rest: plain BERT."""
    hf = hf_fast(vocab_file)

    def plain(text):
        return hf.encode(text, add_special_tokens=False)

    for text, tokens in WWM_CASES.items():
        assert wwm_encode(text, segment, plain, dict(ID), "[UNK]") == ids(tokens), text
    assert wwm_encode("the fox", segment, plain, dict(ID), "[UNK]") == ids(["the", "fox"])
    assert wwm_encode("", segment, plain, dict(ID), "[UNK]") == []


def test_wwm_unknown_pieces_take_the_unknown_tokens_id(vocab_file, segment):
    hf = hf_fast(vocab_file)

    def plain(text):
        return hf.encode(text, add_special_tokens=False)

    vocab = {"<u>": 70, "中": 30, "国": 40, "人": 50}  # no ## pieces at all
    assert wwm_encode("中国人", segment, plain, vocab, "<u>") == [30, 70, 50]
    assert wwm_encode("the 囧 fox", segment, plain, vocab, "<u>") == [ID["the"], 70, ID["fox"]]


@pytest.fixture
def jieba_or_table(vocab_file):
    return wwm_tokenizer(vocab_file)


def test_bert_tokenizer_chinese_wwm_by_hand(jieba_or_table, vocab_file):
    tok = jieba_or_table
    cls, sep = ID["[CLS]"], ID["[SEP]"]
    for text, tokens in WWM_CASES.items():
        assert tok.encode(text) == ids(tokens), text
        assert tok.encode(text, add_special_tokens=True) == [cls, *ids(tokens), sep], text
        assert tok.tokenize(text) == tokens, text
    texts = list(WWM_CASES)
    assert tok.encode_batch(texts) == [ids(t) for t in WWM_CASES.values()]
    assert tok.encode_batch(texts, add_special_tokens=True) == [
        [cls, *ids(t), sep] for t in WWM_CASES.values()
    ]
    # without Chinese, and without whole-word segmentation: plain BERT (transformers)
    hf = hf_fast(vocab_file)
    plain = BertTokenizer(vocab_file)
    for text in ["The fox. hello", *texts]:
        want = hf.encode(text, add_special_tokens=False)
        assert plain.encode(text) == want and plain.encode_batch([text]) == [want], text
        assert plain.tokenize(text) == hf.tokenize(text), text
    assert tok.encode("The fox. hello") == hf.encode("The fox. hello", add_special_tokens=False)
    assert tok.tokenize("The fox. hello") == ["the", "fox", ".", "hello"]


def test_chinese_wwm_special_tokens_keep_their_ids(vocab_file):
    """A one-character word that is an appended special token keeps its id (as transformers
    gives it, where every CJK character is its own word)."""
    tok = wwm_tokenizer(vocab_file, additional_special_tokens=["囧"])
    hf = hf_fast(vocab_file, additional_special_tokens=["囧"])
    assert tok.encode("the 囧 fox") == hf.encode("the 囧 fox", add_special_tokens=False)
    assert tok.encode("the 囧 fox") == [ID["the"], len(VOCAB), ID["fox"]]


@pytest.mark.skipif(HAS_JIEBA, reason="checks the message shown without jieba")
def test_chinese_wwm_without_jieba_says_how_to_install(vocab_file):
    tok = BertTokenizer(vocab_file, do_chinese_wwm=True)
    assert tok.encode("the fox") == ids(["the", "fox"])  # no Chinese: no jieba needed
    for encode in (tok.encode, tok.tokenize, lambda t: tok.encode_batch([t])):
        with pytest.raises(ImportError, match="pip install jieba"):
            encode("the 中国人")


@pytest.mark.skipif(not HAS_JIEBA, reason="jieba is not installed")
def test_chinese_wwm_tokens_are_libais(vocab_file):
    """LiBai's own tokenizer with jieba (FullTokenizer(do_chinese_wwm=True)), same tokens."""
    full = libai_bert_tokenization().FullTokenizer(
        str(vocab_file), do_lower_case=True, do_chinese_wwm=True
    )
    tok = BertTokenizer(vocab_file, do_chinese_wwm=True)
    for text in WWM_CASES:
        # a ## piece missing from vocab.txt (##到) is [UNK] here; LiBai keeps its string
        want = [t if t in ID else "[UNK]" for t in full.tokenize(text)]
        assert tok.tokenize(text) == want, text


#: text BERT's normalizer cleans before LiBai segments it -> its tokens, by hand
CLEANED_CASES = {
    "中\u200b国人": "中 ##国 人".split(),  # a zero-width space does not split 中国
    "中\x00国人\ufffd": "中 ##国 人".split(),
    "\uf900 fox": ["\u8c48", "fox"],  # NFD (accents stripped): the unified ideograph
    "FOX中国人": "fox 中 ##国 人".split(),  # letters are kept (and lower-cased)
}


@pytest.mark.skipif(not HAS_JIEBA, reason="jieba is not installed")
def test_chinese_wwm_cleans_text_before_segmenting_as_libai(vocab_file):
    """Characters BERT's cleaning drops cannot split a Chinese word, and a compatibility
    ideograph is normalized when accents are stripped: LiBai's FullTokenizer, by hand."""
    full = libai_bert_tokenization().FullTokenizer(
        str(vocab_file), do_lower_case=True, do_chinese_wwm=True
    )
    tok = BertTokenizer(vocab_file, do_chinese_wwm=True)
    for text, want in CLEANED_CASES.items():
        assert full.tokenize(text) == want, text
        assert tok.tokenize(text) == want, text
        assert tok.encode(text, add_special_tokens=False) == ids(want), text
    # cased, accents kept: U+F900 stays itself (not in the vocabulary), as LiBai keeps it
    cased = libai_bert_tokenization().FullTokenizer(
        str(vocab_file), do_lower_case=False, do_chinese_wwm=True
    )
    kept = BertTokenizer(vocab_file, do_chinese_wwm=True, do_lower_case=False)
    assert cased.tokenize("\uf900 fox") == ["[UNK]", "fox"]
    assert kept.tokenize("\uf900 fox") == ["[UNK]", "fox"]
    stripped = BertTokenizer(
        vocab_file, do_chinese_wwm=True, do_lower_case=False, strip_accents=True
    )
    assert stripped.tokenize("\uf900 fox") == ["\u8c48", "fox"]
