"""GPT-2 byte-level BPE tokenizer on vocab.json + merges.txt (through `tokenizers`)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from bpe_helpers import SAMPLE_TEXTS, train_tiny_bpe, write_hand_bpe

from libai.tokenizer import GPT2Tokenizer, build_tokenizer


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    return train_tiny_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def tok(tiny_files):
    return GPT2Tokenizer(*tiny_files)


def test_known_tokens_map_to_their_vocab_ids(tmp_path):
    vocab_file, merges_file = write_hand_bpe(tmp_path)
    vocab = json.load(open(vocab_file))
    tok = GPT2Tokenizer(vocab_file, merges_file)
    assert tok.tokenize("hello world!") == ["hello", "Ġworld", "!"]
    assert tok.encode("hello world!") == [vocab["hello"], vocab["Ġworld"], vocab["!"]]
    assert tok.decode([vocab["hello"], vocab["Ġworld"]]) == "hello world"
    # the special token is matched whole, never split into bytes
    assert tok.encode("hello<|endoftext|>") == [vocab["hello"], vocab["<|endoftext|>"]]
    assert tok.eod == tok.eos_token_id == tok.eod_token_id == vocab["<|endoftext|>"]
    assert tok.convert_tokens_to_ids(["hello", "Ġworld"]) == [vocab["hello"], vocab["Ġworld"]]
    assert tok.convert_ids_to_tokens(vocab["Ġworld"]) == "Ġworld"
    assert tok.vocab_size == len(tok) == len(vocab)


def test_trained_bpe_round_trips_and_ids_match_vocab(tok, tiny_files):
    vocab = json.load(open(tiny_files[0]))
    texts = SAMPLE_TEXTS[:4] + [
        "  leading spaces\ttabs\n\nnewlines",
        "unicode: héllo wörld ✓ 你好 🙂",
    ]
    for text in texts:
        ids = tok.encode(text)
        assert ids and all(isinstance(i, int) for i in ids)
        assert tok.decode(ids) == text
        assert [vocab[t] for t in tok.tokenize(text)] == ids
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    # frequent words of the training text became single tokens
    assert tok.tokenize(" hello") == ["Ġhello"]
    assert tok.decode(torch.tensor(tok.encode("def hello"))) == "def hello"
    assert tok.eod == vocab["<|endoftext|>"]
    assert tok.decode([tok.eod], skip_special_tokens=True) == ""


def test_same_ids_as_transformers_gpt2_tokenizer(tok, tiny_files):
    transformers = pytest.importorskip("transformers")
    # transformers 5 takes vocab= / merges= (vocab_file= is silently ignored)
    hf = transformers.GPT2TokenizerFast(vocab=tiny_files[0], merges=tiny_files[1])
    for text in SAMPLE_TEXTS[:4] + ["unicode: héllo wörld ✓"]:
        assert hf.encode(text) == tok.encode(text)


def test_padded_vocab_size(tmp_path):
    tok = GPT2Tokenizer(*write_hand_bpe(tmp_path))
    assert tok.vocab_size == 19
    assert tok.padded_vocab_size(1) == 19
    assert tok.padded_vocab_size(128) == 128
    assert tok.padded_vocab_size(32) == 32
    assert tok.padded_vocab_size(19) == 19
    with pytest.raises(ValueError):
        tok.padded_vocab_size(0)


def test_missing_files_are_named(tmp_path, tiny_files):
    vocab_file, merges_file = tiny_files
    missing = str(tmp_path / "nope-vocab.json")
    with pytest.raises(FileNotFoundError, match="nope-vocab.json") as e:
        GPT2Tokenizer(missing, merges_file)
    assert "vocab_file" in str(e.value)
    with pytest.raises(FileNotFoundError, match="merges_file.*nope-merges.txt"):
        GPT2Tokenizer(vocab_file, str(tmp_path / "nope-merges.txt"))


def test_bad_files_and_missing_eos(tmp_path, tiny_files):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bad.json"):
        GPT2Tokenizer(str(bad), tiny_files[1])
    with pytest.raises(ValueError, match="eos_token='<eos>' is not in"):
        GPT2Tokenizer(*tiny_files, eos_token="<eos>")


def test_pickles_and_saves(tok, tmp_path):
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(SAMPLE_TEXTS[0]) == tok.encode(SAMPLE_TEXTS[0])
    vocab, merges = tok.save_vocabulary(tmp_path / "saved")
    assert GPT2Tokenizer(vocab, merges).encode("hello world") == tok.encode("hello world")


def test_build_tokenizer_from_config(tiny_files):
    from libai.config import LazyCall

    cfg = {
        "tokenizer": LazyCall(GPT2Tokenizer)(vocab_file=tiny_files[0], merges_file=tiny_files[1]),
        "append_eod": True,
        "make_vocab_size_divisible_by": 128,
    }
    tok = build_tokenizer(cfg)
    assert isinstance(tok, GPT2Tokenizer) and tok.eod is not None
    assert tok.padded_vocab_size(cfg["make_vocab_size_divisible_by"] * 2) % 256 == 0
    cfg["tokenizer"] = LazyCall(GPT2Tokenizer)(vocab_file="/no/such/vocab.json", merges_file="m")
    with pytest.raises(FileNotFoundError, match="/no/such/vocab.json"):
        build_tokenizer(cfg)
