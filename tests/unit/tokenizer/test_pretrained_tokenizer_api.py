"""The API of LiBai's slow-tokenizer base class (libai.tokenizer.PreTrainedTokenizer) against
Hugging Face transformers' slow ``PreTrainedTokenizer``, which it is modelled on.

Where transformers has the same API, a LiBai subclass (``SlowBert``: BERT's WordPiece on
the basic and WordPiece splitters of transformers' slow BERT tokenizer) and transformers'
``BertTokenizerLegacy`` are built from the same local vocab file and compared on the same
inputs. Where transformers 5 changed or dropped the API (``sanitize_special_tokens``,
``spaces_between_special_tokens``, which tokens are matched whole, the saved files), the
expected values are worked out by hand from the behaviour of transformers 4's slow
tokenizers, which LiBai's follows. Nothing is downloaded; all files are under tmp_path.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
from locales import ascii_locale
from test_pretrained_tokenizer import VOCAB, WordTokenizer
from transformers.models.bert.tokenization_bert_legacy import (
    BasicTokenizer,
    BertTokenizerLegacy,
    WordpieceTokenizer,
    load_vocab,
)

from libai.tokenizer import PreTrainedTokenizer

BERT_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", ".",
    "un", "##aff", "##able", "[", "]", "mask", "do", "n", "'", "t", ",",
]  # fmt: skip


class SlowBert(PreTrainedTokenizer):
    """BERT's WordPiece as a LiBai slow tokenizer; its init arguments go to the base class
    (as transformers' tokenizers pass theirs), the vocab file among them."""

    vocab_files_names = {"vocab_file": "vocab.txt"}

    def __init__(
        self,
        vocab_file,
        do_lower_case=True,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        **kwargs,
    ):
        super().__init__(
            vocab_file=vocab_file,
            do_lower_case=do_lower_case,
            unk_token=unk_token,
            sep_token=sep_token,
            pad_token=pad_token,
            cls_token=cls_token,
            mask_token=mask_token,
            **kwargs,
        )
        self.do_lower_case = do_lower_case
        self.vocab = load_vocab(vocab_file)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.basic = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece = WordpieceTokenizer(vocab=self.vocab, unk_token=unk_token)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab, **self.added_tokens_encoder)

    def _tokenize(self, text, split_special_tokens=False):
        never_split = None if split_special_tokens else self.all_special_tokens
        words = self.basic.tokenize(text, never_split=never_split)
        return [piece for word in words for piece in self.wordpiece.tokenize(word)]

    def _convert_token_to_id(self, token):
        return self.vocab.get(token, self.vocab[self.unk_token])

    def _convert_id_to_token(self, index):
        return self.ids_to_tokens.get(index, self.unk_token)

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens).replace(" ##", "").strip()

    def build_inputs_with_special_tokens(self, ids):
        return [self.cls_token_id, *ids, self.sep_token_id]

    def save_vocabulary(self, save_directory):
        path = os.path.join(save_directory, "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in sorted(self.vocab, key=self.vocab.get)))
        return (path,)


class CharTokenizer(PreTrainedTokenizer):
    """One token per character of an alphabet given positionally: no vocabulary file, no
    ``do_lower_case`` attribute, no framing, tokens joined without spaces."""

    def __init__(self, alphabet, **kwargs):
        kwargs.setdefault("unk_token", "?")
        super().__init__(**kwargs)
        self.vocab = {t: i for i, t in enumerate(["?", *alphabet])}

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab, **self.added_tokens_encoder)

    def _tokenize(self, text, **kwargs):
        return [c for c in text if not c.isspace()]

    def _convert_token_to_id(self, token):
        return self.vocab.get(token, 0)

    def _convert_id_to_token(self, index):
        return {i: t for t, i in self.vocab.items()}.get(index, "?")

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)

    def save_vocabulary(self, save_directory):
        return ()


def write_vocab(path, tokens):
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


@pytest.fixture
def bert_vocab(tmp_path):
    return write_vocab(tmp_path / "bert_vocab.txt", BERT_VOCAB)


@pytest.fixture
def word_vocab(tmp_path):
    return write_vocab(tmp_path / "word_vocab.txt", VOCAB)


@pytest.fixture
def c_locale():
    """The POSIX locale (ASCII as the default file encoding), as on a bare container."""
    with ascii_locale():
        yield


def test_clean_up_tokenization_is_transformers_rules(bert_vocab):
    hf = BertTokenizerLegacy(bert_vocab)
    texts = [
        "a , b . c ? d ! e ' f",
        "do n't , I 'm here , it 's ours , we 've seen , you 're late .",
        "DO N'T I 'M IT 'S WE 'VE YOU 'RE",  # the rules are lower-case only
        "no spaces: a,b.c?d!e'f",
    ]
    for text in texts:
        assert PreTrainedTokenizer.clean_up_tokenization(text) == hf.clean_up_tokenization(text)
    assert PreTrainedTokenizer.clean_up_tokenization(texts[1]) == (
        "don't, I'm here, it's ours, we've seen, you're late."
    )


def test_decode_matches_transformers(bert_vocab):
    lib, hf = SlowBert(bert_vocab), BertTokenizerLegacy(bert_vocab)
    assert lib.add_tokens(["<x>"]) == hf.add_tokens(["<x>"]) == 1
    text = "the cat <x> unaffable sat ."
    assert lib.encode(text) == hf.encode(text) == [2, 5, 6, 22, 11, 12, 13, 7, 10, 3]
    ids = hf.encode(text)
    assert lib.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert lib.convert_ids_to_tokens(ids)[0] == "[CLS]"  # special tokens kept by default
    assert lib.convert_ids_to_tokens(ids, skip_special_tokens=True) == (
        hf.convert_ids_to_tokens(ids, skip_special_tokens=True)
    )
    for kind in (list, torch.tensor, np.array):
        for kwargs in ({}, {"skip_special_tokens": True}, {"clean_up_tokenization_spaces": False}):
            assert lib.decode(kind(ids), **kwargs) == hf.decode(kind(ids), **kwargs)
    assert lib.decode(ids, skip_special_tokens=True) == "the cat <x> unaffable sat."
    assert lib.decode(ids, clean_up_tokenization_spaces=False) == (
        "[CLS] the cat <x> unaffable sat . [SEP]"
    )
    # one id, or a 0-d tensor: that token's text
    for one in (5, torch.tensor(5), torch.tensor(22)):
        assert lib.decode(one) == hf.decode(one)
    assert lib.decode(torch.tensor(5)) == "the"
    # added tokens are joined to their neighbours without a space on request (transformers 4;
    # transformers 5 dropped spaces_between_special_tokens)
    no_space = lib.decode(ids, skip_special_tokens=True, spaces_between_special_tokens=False)
    assert no_space == "the cat<x>unaffable sat."


def test_special_tokens_at_init_match_transformers(bert_vocab):
    lib, hf = SlowBert(bert_vocab), BertTokenizerLegacy(bert_vocab)
    assert lib.all_special_tokens == hf.all_special_tokens
    assert lib.all_special_ids == hf.all_special_ids == [1, 3, 0, 2, 4]
    assert lib.additional_special_tokens == []
    assert lib.init_inputs == hf.init_inputs == ()
    # a role given as None stays unset; the roles after it are still set
    lib = SlowBert(bert_vocab, bos_token=None, eos_token="[EOS]", cls_token="<s>")
    hf = BertTokenizerLegacy(bert_vocab, bos_token=None, eos_token="[EOS]", cls_token="<s>")
    assert (lib.bos_token, lib.eos_token, lib.cls_token) == (hf.bos_token, hf.eos_token, "<s>")
    assert hf.cls_token == "<s>" and lib.eos_token == "[EOS]"


def test_add_tokens_counts_and_ids_match_transformers(bert_vocab):
    lib, hf = SlowBert(bert_vocab), BertTokenizerLegacy(bert_vocab)
    calls = [
        [],  # nothing to add
        "<q>",  # one token as a string
        # a repeat in one call and a known word are not added; those after them are
        ["<x>", "Dog", "cat", "<x>", "<y>"],
        ["<x>", "<q>"],  # added before
    ]
    for tokens in calls:
        assert lib.add_tokens(tokens) == hf.add_tokens(tokens)
        assert len(lib) == len(hf)
    assert len(lib) == len(BERT_VOCAB) + 4
    new = ["<q>", "<x>", "dog", "<y>"]  # "Dog" lower-cased: the tokenizer lower-cases text
    assert lib.convert_tokens_to_ids(new) == hf.convert_tokens_to_ids(new) == [22, 23, 24, 25]
    assert lib.get_added_vocab() == {"<q>": 22, "<x>": 23, "dog": 24, "<y>": 25}
    assert lib.tokenize("the <y>cat Dog") == hf.tokenize("the <y>cat Dog")


def test_add_tokens_without_do_lower_case_keeps_the_case(caplog):
    tok = CharTokenizer("abc")
    caplog.set_level(logging.INFO, logger="libai.tokenizer.tokenization_pretrained")
    # "b" is in the vocabulary; "?", the unknown token, is never added
    assert tok.add_tokens(["?", "Dog", "b"]) == 1
    assert tok.get_added_vocab() == {"Dog": 4}
    assert tok.tokenize("aDogb c") == ["a", "Dog", "b", "c"]
    assert tok.decode([1, 4, 2]) == "a Dog b"
    # verbose (the default, as transformers 4's slow tokenizers) logs each added token
    assert "Adding Dog to the vocabulary" in caplog.messages
    caplog.clear()
    quiet = CharTokenizer("abc", verbose=False)
    assert quiet.add_tokens(["Cat"]) == 1 and caplog.messages == []


def test_which_added_tokens_are_matched_whole(word_vocab):
    """transformers 4: the new non-special tokens and every special token are never split."""
    tok = WordTokenizer(word_vocab)
    assert tok.add_tokens(["cat"]) == 0  # known: the text is split as before
    assert tok.tokenize("thecatsat") == ["thecatsat"]
    assert tok.add_tokens(["cat"], special_tokens=True) == 0  # known but special: whole
    assert tok.tokenize("thecatsat") == ["the", "cat", "sat"]
    assert tok.encode("thecatsat") == [2, 4, 5, 6, 3]


def test_add_special_tokens_matches_transformers(bert_vocab):
    lib, hf = SlowBert(bert_vocab), BertTokenizerLegacy(bert_vocab)
    specials = {"bos_token": "[BOS]", "additional_special_tokens": ["<ADD>", "cat"]}
    assert lib.add_special_tokens(specials) == hf.add_special_tokens(specials) == 2
    assert lib.bos_token == hf.bos_token == "[BOS]"
    assert lib.additional_special_tokens == ["<ADD>", "cat"]
    # special tokens are not lower-cased and are matched whole, "cat" too
    ids = hf.convert_tokens_to_ids(["[BOS]", "<ADD>", "cat"])
    assert lib.convert_tokens_to_ids(["[BOS]", "<ADD>", "cat"]) == ids == [22, 23, 6]
    assert lib.tokenize("thecatsat <ADD>") == hf.tokenize("thecatsat <ADD>")
    assert lib.tokenize("thecatsat <ADD>") == ["the", "cat", "sat", "<ADD>"]
    with pytest.raises(ValueError, match="'cat_token' is not a special-token role"):
        lib.add_special_tokens({"cat_token": "cat"})


def test_sanitize_special_tokens_adds_the_missing_ones(word_vocab):
    """transformers 4: each special token not in the vocabulary is added, as a special token
    (not lower-cased, matched whole); returns how many were added."""
    tok = WordTokenizer(word_vocab, bos_token="[BOS]", mask_token="[MASK]")
    assert tok.sanitize_special_tokens() == 2
    assert (tok.bos_token_id, tok.mask_token_id, len(tok)) == (10, 11, 12)
    assert tok.get_added_vocab() == {"[BOS]": 10, "[MASK]": 11}
    assert tok.tokenize("the[CLS]cat[MASK]") == ["the", "[CLS]", "cat", "[MASK]"]
    assert tok.sanitize_special_tokens() == 0


def test_tokenize_passes_keyword_arguments_to_tokenize_of_the_subclass(bert_vocab):
    lib, hf = SlowBert(bert_vocab), BertTokenizerLegacy(bert_vocab)
    text = "the [MASK] cat"
    assert lib.tokenize(text) == hf._tokenize(text) == ["the", "[MASK]", "cat"]
    split = hf._tokenize(text, split_special_tokens=True)
    assert (
        lib.tokenize(text, split_special_tokens=True) == split == ["the", "[", "mask", "]", "cat"]
    )


def test_encode_of_ids_batches_and_bad_input(word_vocab, bert_vocab):
    tok = WordTokenizer(word_vocab)
    assert tok.encode([2, 4, 3]) == [2, 4, 3]  # ids pass through as they are
    assert tok.encode((5, 6), return_tensors="pt").tolist() == [5, 6]
    batch = ["the cat", "the mat"]
    assert tok.encode(batch) == [[2, 4, 5, 3], [2, 4, 8, 3]]
    t = tok.encode(batch, return_tensors="pt")
    assert t.dtype == torch.long and t.tolist() == [[2, 4, 5, 3], [2, 4, 8, 3]]
    a = tok.encode(batch, return_tensors="np")
    assert a.dtype == np.int64 and a.tolist() == [[2, 4, 5, 3], [2, 4, 8, 3]]
    hf = BertTokenizerLegacy(bert_vocab)
    for bad in ([], [2.5], [None]):
        with pytest.raises(ValueError, match="encode takes a string"):
            tok.encode(bad)
    for bad in ([], [2.5]):
        with pytest.raises(ValueError):
            hf.encode(bad)


def test_ids_of_an_empty_text_are_integers(bert_vocab):
    tok, hf = CharTokenizer("abc"), BertTokenizerLegacy(bert_vocab)
    assert tok.encode("") == []
    for kind in ("pt", "np"):
        ids, reference = tok.encode("", return_tensors=kind), hf("", return_tensors=kind)
        assert ids.dtype == reference["input_ids"].dtype
        assert ids.shape == (0,)
    assert tok.encode("", return_tensors="pt").dtype == torch.int64
    assert tok.encode("", return_tensors="np").dtype == np.int64


def test_padded_vocab_size(word_vocab):
    tok = WordTokenizer(word_vocab)
    assert tok.add_tokens(["<x>"]) == 1
    assert (len(tok), tok.padded_vocab_size(), tok.padded_vocab_size(4)) == (11, 11, 12)


def _saved_tokenizer(bert_vocab):
    tok = SlowBert(bert_vocab, do_lower_case=False, additional_special_tokens=["<中>"])
    assert tok.sanitize_special_tokens() == 1
    assert tok.add_tokens(["Ünï"]) == 1
    return tok


def test_save_pretrained_files(bert_vocab, tmp_path):
    tok = _saved_tokenizer(bert_vocab)
    tok.save_pretrained(tmp_path)  # a directory that exists already
    paths = tok.save_pretrained(tmp_path)  # and again
    names = {"vocab.txt", "added_tokens.json", "special_tokens_map.json", "tokenizer_config.json"}
    assert {os.path.basename(p) for p in paths} == names
    # JSON as transformers writes it: two-space indent, non-ASCII characters as they are
    added = (tmp_path / "added_tokens.json").read_text(encoding="utf-8")
    assert added == '{\n  "<中>": 22,\n  "Ünï": 23\n}'
    special = (tmp_path / "special_tokens_map.json").read_text(encoding="utf-8")
    assert special == (
        '{\n  "unk_token": "[UNK]",\n  "sep_token": "[SEP]",\n  "pad_token": "[PAD]",\n'
        '  "cls_token": "[CLS]",\n  "mask_token": "[MASK]",\n'
        '  "additional_special_tokens": [\n    "<中>"\n  ]\n}'
    )
    # the init arguments but the vocabulary file (it is saved under its own name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config == {
        "do_lower_case": False,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "additional_special_tokens": ["<中>"],
    }


def test_save_and_load_non_ascii_tokens_under_the_posix_locale(bert_vocab, tmp_path, c_locale):
    """The files are UTF-8 whatever the locale's encoding, as transformers'."""
    tok = _saved_tokenizer(bert_vocab)
    tok.save_pretrained(tmp_path / "saved")
    again = SlowBert.from_pretrained(tmp_path / "saved")
    assert again.do_lower_case is False
    assert again.additional_special_tokens == ["<中>"]
    assert again.get_added_vocab() == {"<中>": 22, "Ünï": 23}
    assert again.tokenize("The <中>cat Ünï") == ["[UNK]", "<中>", "cat", "Ünï"]
    assert again.encode("the Ünï") == tok.encode("the Ünï") == [2, 5, 23, 3]


def test_from_pretrained_of_one_vocab_file_and_init_inputs(word_vocab, tmp_path):
    # a single vocabulary file for a tokenizer that has one (transformers 4 allowed it)
    tok = WordTokenizer.from_pretrained(word_vocab)
    assert tok.encode("the cat sat") == [2, 4, 5, 6, 3]
    assert tok.get_added_vocab() == {}
    # positional arguments after the path go to __init__ (transformers' *init_inputs)
    chars = CharTokenizer("abc", additional_special_tokens=["<s>"])
    assert chars.sanitize_special_tokens() == 1
    chars.save_pretrained(tmp_path / "chars")
    again = CharTokenizer.from_pretrained(tmp_path / "chars", "cab")
    assert again.encode("ab<s>c") == [2, 3, 4, 1]
    assert again.additional_special_tokens == ["<s>"]
