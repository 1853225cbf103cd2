"""LiBai's slow-tokenizer base class (libai.tokenizer.PreTrainedTokenizer) under a tiny
vocab-file subclass written as LiBai's projects write theirs: ids, special and added tokens,
decoding, saving and loading locally, and no download for a name that is not a path."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from libai.tokenizer import PreTrainedTokenizer
from libai.tokenizer.tokenization_base import PreTrainedTokenizer as FromLiBaisPath

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "."]


class WordTokenizer(PreTrainedTokenizer):
    """Whitespace words on a vocab.txt, framed as [CLS] ... [SEP]."""

    vocab_files_names = {"vocab_file": "vocab.txt"}

    def __init__(self, vocab_file, do_lower_case=True, **kwargs):
        kwargs.setdefault("unk_token", "[UNK]")
        kwargs.setdefault("cls_token", "[CLS]")
        kwargs.setdefault("sep_token", "[SEP]")
        kwargs.setdefault("pad_token", "[PAD]")
        super().__init__(**kwargs)
        self.do_lower_case = do_lower_case
        with open(vocab_file, encoding="utf-8") as f:
            self.vocab = {t.rstrip("\n"): i for i, t in enumerate(f)}
        self.inv_vocab = {i: t for t, i in self.vocab.items()}

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab, **self.added_tokens_encoder)

    def _tokenize(self, text, **kwargs):
        return (text.lower() if self.do_lower_case else text).split()

    def _convert_token_to_id(self, token):
        return self.vocab.get(token, self.vocab[self.unk_token])

    def _convert_id_to_token(self, index):
        return self.inv_vocab.get(index, self.unk_token)

    def build_inputs_with_special_tokens(self, ids):
        return [self.cls_token_id, *ids, self.sep_token_id]

    def save_vocabulary(self, save_directory):
        path = os.path.join(save_directory, "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in VOCAB))
        return (path,)


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB))
    return str(path)


def test_ids_special_and_added_tokens(vocab_file, tmp_path):
    assert FromLiBaisPath is PreTrainedTokenizer  # LiBai's projects import it from there
    tok = WordTokenizer(vocab_file, bos_token="[BOS]", additional_special_tokens=["<x>"])
    assert tok.encode("The cat sat on the dog .") == [2, 4, 5, 6, 7, 4, 1, 9, 3]
    assert torch.equal(tok.encode("the mat", return_tensors="pt"), torch.tensor([2, 4, 8, 3]))
    # special tokens are set before they are in the vocabulary, as LiBai's; then added
    assert tok.bos_token == "[BOS]" and tok.bos_token_id == 1  # still the unknown id
    assert tok.add_special_tokens({"bos_token": "[BOS]", "eos_token": "[EOS]"}) == 2
    assert (tok.bos_token_id, tok.eos_token_id, len(tok)) == (10, 11, 12)
    assert tok.add_tokens(["<x>", "Dog", "cat"]) == 2  # "cat" is known; "Dog" lower-cased
    assert tok.convert_tokens_to_ids(["<x>", "dog"]) == [12, 13]
    # added tokens are whole in text (spaces around them dropped), never split
    assert tok.tokenize("the cat<x>sat [EOS]") == ["the", "cat", "<x>", "sat", "[EOS]"]
    assert tok.encode("[BOS] dog on the mat [EOS]") == [2, 10, 13, 7, 4, 8, 11, 3]
    ids = [2, 10, 4, 5, 12, 6, 9, 11, 3]
    assert tok.decode(ids) == "[CLS] [BOS] the cat <x> sat. [EOS] [SEP]"
    assert tok.decode(ids, skip_special_tokens=True) == "the cat sat."
    assert tok.all_special_tokens == ["[BOS]", "[EOS]", "[UNK]", "[SEP]", "[PAD]", "[CLS]", "<x>"]
    assert tok.padded_vocab_size(8) == 16
    # saved and loaded back from the local directory: the same ids
    saved = tok.save_pretrained(tmp_path / "saved")
    assert {os.path.basename(p) for p in saved} >= {"vocab.txt", "added_tokens.json"}
    again = WordTokenizer.from_pretrained(tmp_path / "saved")
    assert again.get_vocab() == tok.get_vocab()
    assert again.encode("[BOS] dog <x>") == tok.encode("[BOS] dog <x>")
    assert again.special_tokens_map == tok.special_tokens_map


def test_no_download_and_unimplemented_methods_name_themselves(vocab_file):
    with pytest.raises(FileNotFoundError, match="Nothing is downloaded at run time"):
        WordTokenizer.from_pretrained("bert-base-chinese")
    with pytest.raises(NotImplementedError, match="must define _tokenize"):
        PreTrainedTokenizer().tokenize("text")


def test_role_setters_tensor_kinds_and_additional_special_tokens(vocab_file):
    tok = WordTokenizer(vocab_file)
    tok.pad_token = "[SEP]"
    assert (tok.pad_token, tok.pad_token_id) == ("[SEP]", 3)
    tok.pad_token = None
    assert tok.pad_token is None and tok.pad_token_id is None
    with pytest.raises(TypeError, match="pad_token has to be a str, got int"):
        tok.pad_token = 5
    ids = [2, 4, 3]
    assert tok.convert_to_tensors(ids) is ids
    for kind in ("pt", "of"):  # "of": OneFlow's name in LiBai's projects, a torch tensor here
        t = tok.convert_to_tensors(ids, return_tensors=kind)
        assert t.dtype == torch.long and t.tolist() == ids
    a = tok.convert_to_tensors(ids, return_tensors="np")
    assert a.dtype == np.int64 and a.tolist() == ids
    with pytest.raises(ValueError, match="return_tensors must be None, 'pt', 'of' or 'np'"):
        tok.convert_to_tensors(ids, return_tensors="tf")
    # a list-valued role: each token added as a special token
    assert tok.add_special_tokens({"additional_special_tokens": ["<a>", "<b>"]}) == 2
    assert tok.convert_tokens_to_ids(["<a>", "<b>"]) == [10, 11]
    assert tok.tokenize("the<a>cat") == ["the", "<a>", "cat"]
