"""The tokenizers' shared API against independent references: transformers' tokenizers built
from the same local files (offsets, special-token ids, saved files reloaded), the `tokenizers` /
`sentencepiece` libraries, and messages / file names worked out by hand.

Every vocabulary is trained here, offline (the fixtures of test_tokenizers_zoo.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_tokenizers_zoo as zoo
from bpe_helpers import write_hand_bpe
from omegaconf import OmegaConf
from tokenizers import Tokenizer

import libai
from libai.config import LazyCall
from libai.tokenizer import (
    BaseTokenizer,
    BertTokenizer,
    GPT2Tokenizer,
    JsonTokenizer,
    RobertaTokenizer,
    T5Tokenizer,
    build_tokenizer,
)
from libai.tokenizer.tokenization_hf import read_special_tokens

transformers = pytest.importorskip("transformers")

# the zoo's vocabularies, trained offline once per module (fixtures shared by name)
bert_dirs = zoo.bert_dirs
gpt2_files = zoo.gpt2_files
llama_dir = zoo.llama_dir
qwen_dir = zoo.qwen_dir
roberta_files = zoo.roberta_files
t5_dir = zoo.t5_dir
CORPUS, TEXTS = zoo.CORPUS, zoo.TEXTS

OFFSET_TEXTS = TEXTS + CORPUS[:3] + [" hello  world ", "a <mask> b</s>", "x<s>y"]


def hf_offsets(hf, text, add_special_tokens):
    enc = hf(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def assert_offsets_like_hf(ours, hf, texts):
    for text in texts:
        for add in (True, False):
            assert ours.encode_with_offsets(text, add_special_tokens=add) == hf_offsets(
                hf, text, add
            ), (text, add)
        assert ours.encode_with_offsets(text) == hf_offsets(hf, text, False), text


# ---- encode_with_offsets: transformers' return_offsets_mapping ---------------------------------
@pytest.mark.parametrize(
    "options",
    [{}, {"trim_offsets": False}, {"add_prefix_space": True}, {"add_prefix_space": True, "trim_offsets": False}],
)  # fmt: skip
def test_roberta_offsets_match_transformers(roberta_files, options):
    ours = RobertaTokenizer(*roberta_files, **options)
    hf = transformers.RobertaTokenizer(vocab=roberta_files[0], merges=roberta_files[1], **options)
    assert_offsets_like_hf(ours, hf, OFFSET_TEXTS)
    assert ours.add_prefix_space is hf.add_prefix_space
    assert ours.encode("Hello world!") == hf.encode("Hello world!", add_special_tokens=False)


def test_gpt2_and_tokenizer_json_offsets_match_transformers(gpt2_files, llama_dir):
    gpt2 = GPT2Tokenizer(*gpt2_files)
    hf = transformers.GPT2TokenizerFast(vocab=gpt2_files[0], merges=gpt2_files[1])
    assert_offsets_like_hf(gpt2, hf, OFFSET_TEXTS)
    # Llama-like: the post-processor adds <s> with offsets (0, 0)
    llama = JsonTokenizer(llama_dir)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(llama_dir / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    assert_offsets_like_hf(llama, hf, OFFSET_TEXTS)
    ids, offsets = llama.encode_with_offsets("Hello world", add_special_tokens=True)
    assert ids[0] == hf.bos_token_id and offsets[0] == (0, 0)


def test_t5_has_no_offsets(t5_dir):
    tok = T5Tokenizer(t5_dir / "spiece.model", extra_ids=10)
    with pytest.raises(NotImplementedError, match="T5Tokenizer has no character offsets"):
        tok.encode_with_offsets("hello world")


# ---- GPT-2 options and special tokens ----------------------------------------------------------
@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_gpt2_special_tokens_and_options_match_transformers(gpt2_files, add_prefix_space):
    vocab, merges = gpt2_files
    hf = transformers.GPT2TokenizerFast(
        vocab=vocab, merges=merges, add_prefix_space=add_prefix_space
    )
    ours = GPT2Tokenizer(vocab, merges, add_prefix_space=add_prefix_space)
    assert (ours.bos, ours.eos, ours.pad) == (hf.bos_token_id, hf.eos_token_id, None)
    assert hf.bos_token_id is not None and hf.pad_token_id is None
    assert ours.add_prefix_space is hf.add_prefix_space is add_prefix_space
    for text in OFFSET_TEXTS:
        assert ours.encode(text) == hf.encode(text), text
    # GPT-2 has no pad token: set it, as transformers users do
    padded = GPT2Tokenizer(vocab, merges, pad_token="<|endoftext|>")
    hf_padded = transformers.GPT2TokenizerFast(
        vocab=vocab, merges=merges, pad_token="<|endoftext|>"
    )
    assert padded.pad == padded.pad_token_id == hf_padded.pad_token_id is not None
    assert padded.bos == hf_padded.bos_token_id


def test_gpt2_libai_options_accepted_unknown_ones_rejected(gpt2_files):
    hf = transformers.GPT2TokenizerFast(vocab=gpt2_files[0], merges=gpt2_files[1])
    # LiBai's GPT2Tokenizer signature: these are accepted and change nothing
    ours = GPT2Tokenizer(*gpt2_files, do_lower_case=True, do_chinese_wwm=False, errors="replace")
    assert ours.encode("Hello World") == hf.encode("Hello World")
    with pytest.raises(TypeError) as e:
        GPT2Tokenizer(*gpt2_files, lowercase=True, bogus=1)
    assert str(e.value) == (
        "GPT2Tokenizer.__init__() got unexpected keyword argument(s) ['bogus', 'lowercase']"
    )


# ---- messages name the class, the argument and the file ---------------------------------------
_GPT2_VOCAB_HINT = "a vocab.json (GPT-2's, or one trained with the `tokenizers` library)"
_GPT2_MERGES_HINT = "a merges.txt (GPT-2's, or one trained with the `tokenizers` library)"


def _missing_message(owner, arg, path, hint):
    flag = "--" + arg.replace("_", "-")
    return (
        f"{owner} {arg} not found: {path} does not exist. Set tokenization.tokenizer.{arg} "
        f"(or {flag}) to {hint}."
    )


@pytest.mark.parametrize("case", ["gpt2_vocab", "gpt2_merges", "roberta_vocab", "roberta_merges", "t5", "json"])  # fmt: skip
def test_missing_file_messages(case, tmp_path, gpt2_files):
    missing = str(tmp_path / "nowhere" / "missing.file")
    vocab, merges = gpt2_files
    build, owner, arg, hint = {
        "gpt2_vocab": (lambda: GPT2Tokenizer(missing, merges), "GPT2Tokenizer", "vocab_file", _GPT2_VOCAB_HINT),
        "gpt2_merges": (lambda: GPT2Tokenizer(vocab, missing), "GPT2Tokenizer", "merges_file", _GPT2_MERGES_HINT),
        "roberta_vocab": (lambda: RobertaTokenizer(missing, merges), "RobertaTokenizer", "vocab_file", _GPT2_VOCAB_HINT),
        "roberta_merges": (lambda: RobertaTokenizer(vocab, missing), "RobertaTokenizer", "merges_file", _GPT2_MERGES_HINT),
        "t5": (lambda: T5Tokenizer(missing), "T5Tokenizer", "vocab_file", "a sentencepiece model (spiece.model)"),
        "json": (lambda: JsonTokenizer(missing), "JsonTokenizer", "tokenizer_file",
                 "a Hugging Face tokenizer.json (or the directory holding it)"),
    }[case]  # fmt: skip
    with pytest.raises(FileNotFoundError) as e:
        build()
    assert str(e.value) == _missing_message(owner, arg, missing, hint)


class InMemoryTokenizer(BaseTokenizer):
    """A BaseTokenizer subclass on a ``tokenizers.Tokenizer`` with no vocabulary file."""

    def __init__(self, tokenizer_str: str, eos_token: str | None = None):
        self._init_args = {"tokenizer_str": tokenizer_str, "eos_token": eos_token}
        self._tokenizer = Tokenizer.from_str(tokenizer_str)
        self._set_special_tokens(eos_token=eos_token)


def test_unknown_tokens_are_reported_with_the_class_and_vocabulary(gpt2_files, qwen_dir):
    vocab, merges = gpt2_files
    tok = GPT2Tokenizer(vocab, merges)
    with pytest.raises(KeyError) as e:
        tok.convert_tokens_to_ids("never-a-token")
    assert e.value.args[0] == f"token 'never-a-token' is not in the vocabulary of {vocab}"
    with pytest.raises(ValueError) as e:
        GPT2Tokenizer(vocab, merges, pad_token="<pad>")
    assert str(e.value) == (
        f"GPT2Tokenizer pad_token='<pad>' is not in the vocabulary of {vocab}; add it to the "
        "vocabulary or set pad_token to a token that is."
    )
    # a subclass without vocabulary files (vocab_files_names is empty) says "?"
    raw = (qwen_dir / "tokenizer.json").read_text()
    reference = Tokenizer.from_str(raw)
    mem = InMemoryTokenizer(raw, eos_token="<|im_end|>")
    assert mem.eod == reference.token_to_id("<|im_end|>")
    assert mem.encode("hello world") == reference.encode("hello world").ids
    with pytest.raises(KeyError) as e:
        mem.convert_tokens_to_ids("never-a-token")
    assert e.value.args[0] == "token 'never-a-token' is not in the vocabulary of ?"
    with pytest.raises(ValueError) as e:
        InMemoryTokenizer(raw, eos_token="<eos>")
    assert str(e.value).startswith(
        "InMemoryTokenizer eos_token='<eos>' is not in the vocabulary of ?; add it"
    )


def test_padded_vocab_size_default_is_the_vocab_size(tmp_path):
    vocab, merges = write_hand_bpe(tmp_path)
    hf = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    tok = GPT2Tokenizer(vocab, merges)
    assert len(hf) == 19  # odd: any rounding would show
    assert tok.padded_vocab_size() == len(hf)


# ---- save_vocabulary: files transformers reloads ----------------------------------------------
def test_save_vocabulary_reloads_in_transformers(gpt2_files, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # files must land in save_directory, not here
    tok = GPT2Tokenizer(*gpt2_files)
    out = tmp_path / "out"
    out.mkdir()  # an existing directory, as for transformers' save_vocabulary
    saved = tok.save_vocabulary(out)
    assert saved == (str(out / "vocab.json"), str(out / "merges.txt"))
    hf = transformers.GPT2TokenizerFast.from_pretrained(out)
    for text in OFFSET_TEXTS:
        assert tok.encode(text) == hf.encode(text), text
    # transformers' naming of a prefix: "<prefix>-vocab.json"
    prefixed = tok.save_vocabulary(out, filename_prefix="run1")
    assert prefixed == (str(out / "run1-vocab.json"), str(out / "run1-merges.txt"))
    hf = transformers.GPT2TokenizerFast(vocab=prefixed[0], merges=prefixed[1])
    assert tok.encode(CORPUS[0]) == hf.encode(CORPUS[0])
    assert sorted(os.listdir(out)) == [
        "merges.txt",
        "run1-merges.txt",
        "run1-vocab.json",
        "vocab.json",
    ]
    assert os.listdir(cwd) == []


def test_json_tokenizer_save_vocabulary_reloads_in_transformers(llama_dir, tmp_path):
    tok = JsonTokenizer(llama_dir)
    out = tmp_path / "saved"
    out.mkdir()
    saved = tok.save_vocabulary(out)
    assert saved == (str(out / "tokenizer.json"), str(out / "tokenizer_config.json"))
    hf = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf.bos_token, hf.eos_token, hf.unk_token, hf.pad_token) == (
        "<s>",
        "</s>",
        "<unk>",
        None,
    )
    for text in OFFSET_TEXTS:
        assert tok.encode(text, add_special_tokens=True) == hf.encode(text), text
    # a readable config, indented like transformers' own
    assert Path(saved[1]).read_text(encoding="utf-8") == (
        '{\n  "bos_token": "<s>",\n  "eos_token": "</s>",\n  "pad_token": null,\n'
        '  "unk_token": "<unk>"\n}'
    )
    prefixed = tok.save_vocabulary(out, filename_prefix="run1")
    assert prefixed == (str(out / "run1-tokenizer.json"), str(out / "run1-tokenizer_config.json"))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=prefixed[0])
    assert tok.encode(CORPUS[1], add_special_tokens=True) == hf.encode(CORPUS[1])


# ---- JsonTokenizer: special tokens as transformers reads them ---------------------------------
def test_json_tokenizer_explicit_special_tokens_match_transformers(llama_dir, qwen_dir):
    file = str(llama_dir / "tokenizer.json")
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>", "unk_token": "<unk>"}
    ours = JsonTokenizer(file, **specials)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=file, **specials)
    assert (ours.bos, ours.eos, ours.pad, ours.unk) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
        hf.unk_token_id,
    )
    assert len({ours.bos, ours.eos, ours.pad}) == 3
    # explicit arguments override the directory's tokenizer_config.json
    override = {
        "bos_token": "<|im_start|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }
    ours = JsonTokenizer(qwen_dir, **override)
    hf = transformers.AutoTokenizer.from_pretrained(qwen_dir, **override)
    assert (ours.bos, ours.eos, ours.pad, ours.unk) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
        hf.unk_token_id,
    )


def test_json_tokenizer_reads_special_tokens_map(qwen_dir, tmp_path):
    """Without tokenizer_config.json the special tokens come from special_tokens_map.json."""
    directory = tmp_path / "stm"
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes((qwen_dir / "tokenizer.json").read_bytes())
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}})
    )
    ours = JsonTokenizer(directory)
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    assert (
        (ours.eos_token, ours.pad_token)
        == (hf.eos_token, hf.pad_token)
        == (
            "<|im_end|>",
            "<|endoftext|>",
        )
    )
    assert (ours.eos, ours.pad) == (hf.eos_token_id, hf.pad_token_id)


def test_read_special_tokens_returns_token_strings_only(tmp_path):
    # -> dict[str, str]: values that are not token strings are left out
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": None, "eos_token": "</s>", "pad_token": 0, "unk_token": {"content": 3}}
        )
    )
    assert read_special_tokens(str(tmp_path)) == {"eos_token": "</s>"}


def test_get_vocab_includes_added_tokens(qwen_dir, tmp_path):
    backend = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    model_size = backend.get_vocab_size(with_added_tokens=False)
    backend.add_special_tokens(["<|tool_call|>"])
    backend.add_tokens(["zzzword"])
    file = str(tmp_path / "tokenizer.json")
    backend.save(file)
    ours = JsonTokenizer(file, eos_token="<|tool_call|>")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=file, eos_token="<|tool_call|>")
    assert ours.get_vocab() == hf.get_vocab()
    assert ours.vocab_size == len(hf) == model_size + 2
    assert ours.eod == hf.eos_token_id == ours.get_vocab()["<|tool_call|>"] >= model_size


# ---- T5 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5_overlap_dir(tmp_path_factory):
    """A sentencepiece model with two user-defined pieces, one a prefix of the other."""
    out = tmp_path_factory.mktemp("t5_overlap")
    return zoo.train_t5_spiece(out, user_defined_symbols=["<sep>", "<sep><sep>"])


@pytest.mark.parametrize("extra_ids", [0, 3])
def test_t5_overlapping_special_tokens_match_transformers(t5_overlap_dir, extra_ids):
    """The longest special token wins, as in transformers; ``extra_ids=0`` is allowed."""
    specials = {"eos_token": "<sep>", "pad_token": "<sep><sep>"}
    ours = T5Tokenizer(t5_overlap_dir / "spiece.model", extra_ids=extra_ids, **specials)
    hf = transformers.T5Tokenizer.from_pretrained(t5_overlap_dir, extra_ids=extra_ids, **specials)
    assert ours.vocab_size == len(hf) and ours.sentinel_tokens == [
        f"<extra_id_{i}>" for i in range(extra_ids)
    ]
    texts = ["a<sep><sep>b<sep>c", "<sep><sep><sep>x", "x <sep> <sep><sep>", "hello world"]
    texts += [f"a<extra_id_{extra_ids - 1}><sep><sep>b"] if extra_ids else []
    for text in texts:
        assert ours.encode(text) == hf.encode(text), text
        assert ours.tokenize(text) == hf.tokenize(text), text
    assert (ours.eos, ours.pad) == (hf.eos_token_id, hf.pad_token_id)
    assert ours.tokenize("<sep><sep>") == ["<sep><sep>"]


def test_t5_ids_past_the_vocabulary_have_no_token(t5_dir):
    ours = T5Tokenizer(t5_dir / "spiece.model", extra_ids=10)
    hf = transformers.T5Tokenizer.from_pretrained(t5_dir, extra_ids=10)
    last = ours.vocab_size - 1
    assert ours.convert_ids_to_tokens([last, last + 1]) == hf.convert_ids_to_tokens(
        [last, last + 1]
    )
    assert ours.convert_ids_to_tokens(last + 1) is None is hf.convert_ids_to_tokens(last + 1)
    assert ours.convert_ids_to_tokens(last) == "<extra_id_0>"


# ---- build_tokenizer ---------------------------------------------------------------------------
def test_build_tokenizer_from_a_namespace(gpt2_files):
    """A Megatron-style ``args`` namespace (attributes, not a mapping) works like a dict."""
    hf = transformers.GPT2TokenizerFast(vocab=gpt2_files[0], merges=gpt2_files[1])
    lazy = LazyCall(GPT2Tokenizer)(vocab_file=gpt2_files[0], merges_file=gpt2_files[1])
    tok = build_tokenizer(argparse.Namespace(tokenizer=lazy, append_eod=True))
    assert isinstance(tok, GPT2Tokenizer) and tok.eod == hf.eos_token_id
    assert tok.encode(CORPUS[0]) == hf.encode(CORPUS[0])
    # an already built tokenizer, and append_eod left out (LiBai's default: False)
    built = GPT2Tokenizer(*gpt2_files)
    assert build_tokenizer(argparse.Namespace(tokenizer=built)) is built
    assert build_tokenizer({"tokenizer": built, "append_eod": True}) is built
    with pytest.raises(ValueError, match="no `tokenizer` entry"):
        build_tokenizer(argparse.Namespace(append_eod=True))


def test_build_tokenizer_append_eod_defaults_to_false(bert_dirs):
    vocab = str(bert_dirs[True] / "vocab.txt")
    hf = transformers.BertTokenizer.from_pretrained(bert_dirs[True])
    cfg = OmegaConf.create()
    cfg.tokenizer = LazyCall(BertTokenizer)(vocab_file=vocab)
    tok = build_tokenizer(cfg)  # BERT has no eod, and append_eod is not set
    assert tok.mask == hf.mask_token_id and tok.eod is None
    # a transformers tokenizer has no `eod`: with append_eod it is refused, not crashed on
    with pytest.raises(ValueError, match="no end-of-document token"):
        build_tokenizer({"tokenizer": hf, "append_eod": True})
    assert build_tokenizer({"tokenizer": hf}) is hf


# ---- files are read as UTF-8 whatever the locale -----------------------------------------------
_LOCALE_CHILD = """
import json, sys
from libai.tokenizer import GPT2Tokenizer, JsonTokenizer
directory, vocab, merges, text = sys.argv[1:5]
tok = JsonTokenizer(directory)
gpt2 = GPT2Tokenizer(vocab, merges, eos_token="</s>", bos_token="<s>")
print(json.dumps({"eos_token": tok.eos_token, "eos": tok.eos, "ids": tok.encode(text),
                  "gpt2": gpt2.encode(text)}))
"""


def test_files_are_read_as_utf8_in_an_ascii_locale(roberta_files, qwen_dir, tmp_path):
    """DeepSeek-style non-ASCII special tokens and byte-level vocab.json ("Ġ") load in a
    POSIX locale without UTF-8 (no locale coercion, no UTF-8 mode)."""
    eos = "<｜end▁of▁sentence｜>"
    backend = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    backend.add_special_tokens([eos])
    directory = tmp_path / "deepseek"
    directory.mkdir()
    backend.save(str(directory / "tokenizer.json"))
    config = json.dumps({"eos_token": eos}, ensure_ascii=False)  # as transformers writes it
    (directory / "tokenizer_config.json").write_text(config, encoding="utf-8")
    assert "Ġ" in Path(roberta_files[0]).read_text(encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    hf_bpe = transformers.RobertaTokenizer(vocab=roberta_files[0], merges=roberta_files[1])
    text = "hello world"
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    repo = str(Path(libai.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
    argv = [str(directory), *roberta_files, text]
    result = subprocess.run(
        [sys.executable, "-c", _LOCALE_CHILD, *argv], env=env, cwd=tmp_path, capture_output=True
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    got = json.loads(result.stdout)
    assert got == {
        "eos_token": hf.eos_token,
        "eos": hf.eos_token_id,
        "ids": hf.encode(text, add_special_tokens=False),
        "gpt2": hf_bpe.encode(text, add_special_tokens=False),
    }
    assert got["eos_token"] == eos


def test_libai_start_and_end_tokens(bert_dirs, gpt2_files):
    """LiBai's names: the start token is bos, else cls; the end token eos, else sep (what
    its projects frame sentence pairs with); two that differ give neither."""
    bert = BertTokenizer(vocab_file=str(bert_dirs[True] / "vocab.txt"))
    assert (bert.start_token, bert.end_token) == ("[CLS]", "[SEP]")
    assert (bert.start_token_id, bert.end_token_id) == (bert.cls_token_id, bert.sep_token_id)
    gpt2 = GPT2Tokenizer(*gpt2_files, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert gpt2.start_token == gpt2.end_token == "<|endoftext|>"
    both = BertTokenizer(vocab_file=str(bert_dirs[True] / "vocab.txt"), bos_token="[PAD]")
    assert both.start_token is None and both.start_token_id is None
    assert both.end_token == "[SEP]"
