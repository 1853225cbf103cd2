"""BERT / RoBERTa / T5 / tokenizer.json tokenizers: same ids as transformers, and preprocessing.

Every vocabulary is trained here, offline, with the `tokenizers` and `sentencepiece` trainers.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from libai.data.data_utils import MMapIndexedDataset
from libai.data.sentence_split import split_sentences
from libai.tokenizer import (
    BertTokenizer,
    GPT2Tokenizer,
    JsonTokenizer,
    RobertaTokenizer,
    T5Tokenizer,
    build_tokenizer,
)

transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[3]

_WORDS = (
    "the quick brown fox jumps over lazy dog hello world Hello World héllo wörld naïve café "
    "Straße tokenization unbelievable running runner model training data language Paris "
    "attention layer 你好 世界 2024 3.14 don't stop-believing, well; yes: no! why? (maybe)"
).split()
_rng = random.Random(0)
CORPUS = [
    " ".join(_rng.choice(_WORDS) for _ in range(12)) + _rng.choice([".", "!", "?"])
    for _ in range(300)
]
TEXTS = [
    "Hello world!",
    "HÉLLO Wörld, naïve café. Straße",
    "  leading   spaces\ttabs\n\nnewlines  ",
    "你好世界 hello 🙂🙂",
    "unknownzzz qqq ж",
    "fullwidth ＡＢＣ ① ﬁ, x\u00a0y\u200bz",
    "don't stop-believing, 3.14 (maybe)",
    "",
    " ",
]


# ---- vocabularies, trained in the test ---------------------------------------------------------
@pytest.fixture(scope="module")
def bert_dirs(tmp_path_factory):
    from tokenizers import BertWordPieceTokenizer

    dirs = {}
    for lowercase in (True, False):
        out = tmp_path_factory.mktemp("bert_uncased" if lowercase else "bert_cased")
        wordpiece = BertWordPieceTokenizer(lowercase=lowercase)
        wordpiece.train_from_iterator(
            CORPUS,
            vocab_size=200,
            min_frequency=1,
            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            show_progress=False,
        )
        wordpiece.save_model(str(out))
        dirs[lowercase] = out
    return dirs


@pytest.fixture(scope="module")
def roberta_files(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("roberta")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS,
        vocab_size=400,
        min_frequency=2,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.save_model(str(out))
    return str(out / "vocab.json"), str(out / "merges.txt")


def train_t5_spiece(out, **options):
    """A T5-like unigram ``spiece.model`` in ``out`` (pad 0, eos 1, unk 2, no bos) on CORPUS;
    ``options`` go to sentencepiece's trainer (e.g. ``user_defined_symbols``)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(out / "spiece"),
        model_type="unigram",
        vocab_size=150,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        minloglevel=2,
        **options,
    )
    return out


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return train_t5_spiece(tmp_path_factory.mktemp("t5"))


def _train_json(out, model, specials, configure, config):
    from tokenizers import Tokenizer, trainers

    tokenizer = Tokenizer(model)
    configure(tokenizer)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False, **config.pop("trainer", {})
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    post = config.pop("post", None)
    if post is not None:
        tokenizer.post_processor = post(tokenizer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A Qwen2-like tokenizer.json: byte-level BPE, chat special tokens, no bos."""
    from tokenizers import decoders, models, pre_tokenizers, processors

    def configure(tok):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
        "trainer": {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()},
    }
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return _train_json(tmp_path_factory.mktemp("qwen"), models.BPE(), specials, configure, config)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A Llama-like tokenizer.json: metaspace BPE with <unk>, and a post-processor adding <s>."""
    from tokenizers import decoders, models, normalizers, processors

    def configure(tok):
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )

    def post(tok):
        bos = ("<s>", tok.token_to_id("<s>"))
        return processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])

    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "post": post}
    model = models.BPE(unk_token="<unk>", fuse_unk=True)
    return _train_json(
        tmp_path_factory.mktemp("llama"), model, ["<unk>", "<s>", "</s>"], configure, config
    )


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    from bpe_helpers import train_tiny_bpe

    return train_tiny_bpe(tmp_path_factory.mktemp("gpt2"))


def assert_same_as_hf(ours, hf, texts, decode=True):
    for text in texts:
        assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == hf.encode(
            text, add_special_tokens=False
        ), text
        assert ours.tokenize(text) == hf.tokenize(text), text
        if decode:
            ids = hf.encode(text)
            assert ours.decode(ids) == hf.decode(ids), text
            assert ours.decode(ids, skip_special_tokens=True) == hf.decode(
                ids, skip_special_tokens=True
            ), text
    assert ours.vocab_size == len(hf)
    assert ours.get_vocab() == hf.get_vocab()


# ---- same ids as transformers ----------------------------------------------------------------
@pytest.mark.parametrize("lowercase", [True, False])
def test_bert_matches_transformers(bert_dirs, lowercase):
    vocab = str(bert_dirs[lowercase] / "vocab.txt")
    tok = BertTokenizer(vocab, do_lower_case=lowercase)
    texts = TEXTS + CORPUS[:5] + ["a [MASK] b [mask] [CLS][SEP]x", "[UNK] [PAD]"]
    hf = transformers.BertTokenizer.from_pretrained(bert_dirs[lowercase], do_lower_case=lowercase)
    assert_same_as_hf(tok, hf, texts)
    # and the pure-Python reference implementation
    slow = transformers.BertTokenizerLegacy(vocab_file=vocab, do_lower_case=lowercase)
    for text in texts:
        assert tok.encode(text, add_special_tokens=True) == slow.encode(text), text
    lines = Path(vocab).read_text(encoding="utf-8").splitlines()
    assert (tok.pad, tok.unk, tok.cls, tok.sep, tok.mask) == (0, 1, 2, 3, 4)
    assert tok.cls_token_id == lines.index("[CLS]") and tok.mask_token_id == lines.index("[MASK]")
    assert tok.eod is None and tok.eos is None and tok.bos is None
    assert tok.encode("x [MASK] y").count(tok.mask) == 1  # matched whole, never split
    assert tok.encode("hello world", add_special_tokens=True)[0] == tok.cls


def test_roberta_matches_transformers(roberta_files):
    tok = RobertaTokenizer(*roberta_files)
    hf = transformers.RobertaTokenizer(vocab=roberta_files[0], merges=roberta_files[1])
    texts = TEXTS + CORPUS[:5] + ["a <mask> b <mask>c<s></s> <pad>"]
    assert_same_as_hf(tok, hf, texts)
    vocab = json.loads(Path(roberta_files[0]).read_text())
    assert (tok.bos, tok.pad, tok.eos, tok.unk, tok.mask) == (0, 1, 2, 3, 4)
    assert tok.cls == tok.bos == vocab["<s>"] and tok.sep == tok.eos == tok.eod
    assert tok.encode("Hello world!", add_special_tokens=True) == [0] + tok.encode(
        "Hello world!"
    ) + [2]
    for text in TEXTS:  # byte-level: decoding gives the text back exactly
        assert tok.decode(tok.encode(text)) == text


def test_roberta_shares_gpt2_byte_level_bpe(roberta_files):
    gpt2 = GPT2Tokenizer(*roberta_files, eos_token="</s>", bos_token="<s>")
    roberta = RobertaTokenizer(*roberta_files)
    for text in TEXTS + CORPUS[:3]:
        assert gpt2.encode(text) == roberta.encode(text)


def test_t5_matches_transformers_and_sentencepiece(t5_dir):
    import sentencepiece as spm

    tok = T5Tokenizer(t5_dir / "spiece.model", extra_ids=10)
    hf = transformers.T5Tokenizer.from_pretrained(t5_dir, extra_ids=10)
    texts = TEXTS + CORPUS[:5]
    texts += ["a<extra_id_0>b <extra_id_1> c<extra_id_9>", "</s> x <pad><unk>", "<extra_id_10>"]
    assert_same_as_hf(tok, hf, texts)
    sp = spm.SentencePieceProcessor(model_file=str(t5_dir / "spiece.model"))
    pieces = sp.get_piece_size()
    assert tok.vocab_size == pieces + 10
    for text in TEXTS + CORPUS[:5]:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
        assert tok.encode(text) == sp.encode(text) + [tok.eos]  # encode appends </s>
    # sentinels: appended after the pieces, <extra_id_0> has the highest id
    sentinels = [f"<extra_id_{i}>" for i in range(10)]
    assert tok.sentinel_tokens == tok.get_sentinel_tokens() == tok.additional_special_tokens
    assert tok.sentinel_token_ids == hf.convert_tokens_to_ids(sentinels)
    assert tok.sentinel_token_ids == list(range(pieces + 9, pieces - 1, -1))
    assert tok.additional_special_tokens_ids == tok.get_sentinel_token_ids()
    assert tok.convert_ids_to_tokens(tok.vocab_size - 1) == "<extra_id_0>"
    assert (tok.pad, tok.eos, tok.unk, tok.eod) == (0, 1, 2, 1)
    assert (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2)
    assert tok.bos is None and tok.mask is None
    with pytest.raises(KeyError, match="<extra_id_10>"):
        tok.convert_tokens_to_ids("<extra_id_10>")
    span = tok.encode("The dog <extra_id_0> the <extra_id_1>.", add_special_tokens=False)
    assert span.count(tok.sentinel_token_ids[0]) == 1 and tok.sentinel_token_ids[1] in span


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_json_tokenizer_matches_transformers(name, qwen_dir, llama_dir):
    directory = {"qwen": qwen_dir, "llama": llama_dir}[name]
    config = json.loads((directory / "tokenizer_config.json").read_text())
    tok = JsonTokenizer(directory)  # special tokens from tokenizer_config.json
    specials = {
        k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items() if v is not None
    }
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), **specials
    )
    texts = TEXTS + CORPUS[:5]
    texts += ["<|im_start|>user\nhi<|im_end|><|endoftext|>", "<s> x </s><unk>"]
    assert_same_as_hf(tok, hf, texts)
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    for text in texts:
        assert tok.encode(text, add_special_tokens=True) == auto.encode(text)
    assert (tok.bos, tok.eos, tok.pad, tok.unk) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
        hf.unk_token_id,
    )
    assert tok.eod == tok.eos is not None
    if name == "llama":
        assert tok.encode("Hello", add_special_tokens=True) == [tok.bos] + tok.encode("Hello")
    else:
        assert tok.bos is None and tok.pad == tok.convert_tokens_to_ids("<|endoftext|>")
    # a bare tokenizer.json has no config: special tokens only when given
    bare = JsonTokenizer(directory / "tokenizer.json")
    assert bare.eos is None and bare.encode(texts[-2]) == tok.encode(texts[-2])
    named = JsonTokenizer(directory / "tokenizer.json", eos_token=tok.eos_token)
    assert named.eod == tok.eod


# ---- the shared API ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def all_tokenizers(bert_dirs, roberta_files, t5_dir, qwen_dir, llama_dir, gpt2_files):
    return {
        "bert": BertTokenizer(bert_dirs[True] / "vocab.txt"),
        "roberta": RobertaTokenizer(*roberta_files),
        "t5": T5Tokenizer(t5_dir / "spiece.model", extra_ids=10),
        "qwen": JsonTokenizer(qwen_dir),
        "llama": JsonTokenizer(llama_dir),
        "gpt2": GPT2Tokenizer(*gpt2_files),
    }


def reload_saved(name, saved, directory):
    """A tokenizer of kind ``name`` on the files ``save_vocabulary`` wrote."""
    if name in ("qwen", "llama"):
        return JsonTokenizer(directory)
    if name == "t5":
        return T5Tokenizer(*saved, extra_ids=10)
    cls = {"bert": BertTokenizer, "roberta": RobertaTokenizer, "gpt2": GPT2Tokenizer}[name]
    return cls(*saved)


def test_shared_api(all_tokenizers, tmp_path):
    texts = CORPUS[:4] + ["Hello world!"]
    for name, tok in all_tokenizers.items():
        ids = tok.encode(texts[0], add_special_tokens=False)
        assert ids and all(isinstance(i, int) for i in ids), name
        assert tok.encode_batch(texts) == [tok.encode(t) for t in texts], name
        tokens = tok.convert_ids_to_tokens(ids)
        assert tok.convert_tokens_to_ids(tokens) == ids, name
        assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == tok.decode(ids)
        assert len(tok) == tok.vocab_size == len(tok.get_vocab()), name
        assert tok.padded_vocab_size(128) % 128 == 0 and tok.padded_vocab_size(1) == len(tok)
        assert all(isinstance(i, int) for i in tok.all_special_ids), name
        assert set(tok.all_special_tokens) >= {t for t in [tok.eos_token, tok.pad_token] if t}
        assert repr(tok).startswith(type(tok).__name__ + "("), name
        with pytest.raises(KeyError, match="not in the vocabulary"):
            tok.convert_tokens_to_ids("never-a-token-\u2603\u2603")
        clone = pickle.loads(pickle.dumps(tok))
        assert clone.encode_batch(texts) == tok.encode_batch(texts), name
        saved = tok.save_vocabulary(tmp_path / name)
        assert all(Path(p).is_file() for p in saved), name
        reloaded = reload_saved(name, saved, tmp_path / name)
        assert reloaded.encode_batch(texts) == tok.encode_batch(texts), name
        assert reloaded.all_special_ids == tok.all_special_ids, name


def test_build_tokenizer_from_config(bert_dirs, t5_dir, qwen_dir):
    from libai.config import LazyCall

    cfg = {
        "tokenizer": LazyCall(T5Tokenizer)(vocab_file=str(t5_dir / "spiece.model")),
        "append_eod": True,
    }
    tok = build_tokenizer(cfg)
    assert isinstance(tok, T5Tokenizer) and tok.eod == tok.eos and tok.extra_ids == 100
    cfg["tokenizer"] = LazyCall(JsonTokenizer)(tokenizer_file=str(qwen_dir))
    assert build_tokenizer(cfg).eod is not None
    cfg["tokenizer"] = LazyCall(BertTokenizer)(vocab_file=str(bert_dirs[True] / "vocab.txt"))
    with pytest.raises(ValueError, match="no end-of-document token"):
        build_tokenizer(cfg)  # BERT has no eod
    cfg["append_eod"] = False
    assert build_tokenizer(cfg).mask is not None


# ---- bad input -----------------------------------------------------------------------------
def test_missing_and_bad_files_are_named(tmp_path, roberta_files, bert_dirs, t5_dir):
    cases = [
        (lambda p: BertTokenizer(p), "vocab_file", "vocab.txt"),
        (lambda p: RobertaTokenizer(p, roberta_files[1]), "vocab_file", "vocab.json"),
        (lambda p: RobertaTokenizer(roberta_files[0], p), "merges_file", "merges.txt"),
        (lambda p: T5Tokenizer(p), "vocab_file", "spiece.model"),
        (lambda p: JsonTokenizer(p), "tokenizer_file", "tokenizer.json"),
    ]
    for build, arg, name in cases:
        missing = tmp_path / "nowhere" / f"missing-{name}"
        with pytest.raises(FileNotFoundError, match=f"{arg} not found.*missing-{name}"):
            build(missing)
    (tmp_path / "empty").mkdir()  # a directory without tokenizer.json
    with pytest.raises(FileNotFoundError, match="empty/tokenizer.json"):
        JsonTokenizer(tmp_path / "empty")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00not a model\xff" * 10)
    with pytest.raises(ValueError, match="garbage.bin"):
        T5Tokenizer(garbage)
    with pytest.raises(ValueError, match="garbage.bin"):
        JsonTokenizer(garbage)
    with pytest.raises(ValueError, match=r"mask_token='<MASK>' is not in"):
        BertTokenizer(bert_dirs[True] / "vocab.txt", mask_token="<MASK>")
    with pytest.raises(ValueError, match=r"eos_token='<eos>' is not in"):
        T5Tokenizer(t5_dir / "spiece.model", eos_token="<eos>")
    with pytest.raises(ValueError, match="extra_ids must be >= 0"):
        T5Tokenizer(t5_dir / "spiece.model", extra_ids=-1)


# ---- sentence splitting and preprocessing -------------------------------------------------------
def test_split_sentences():
    text = (
        'Hello world. This is Mr. Smith! Is it? "Yes," he said. J. Doe came, e.g. today. '
        "Pi is 3.14 here.\n\nA new line 你好。世界！ end"
    )
    assert split_sentences(text) == [
        "Hello world.",
        "This is Mr. Smith!",
        "Is it?",
        '"Yes," he said.',
        "J. Doe came, e.g. today.",
        "Pi is 3.14 here.",
        "A new line 你好。",
        "世界！",
        "end",
    ]
    assert split_sentences("  \n ") == [] and split_sentences("one") == ["one"]


def load_preprocess_main():
    spec = importlib.util.spec_from_file_location(
        "preprocess_data", REPO / "tools/preprocess_data.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def corpus_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    docs = [" ".join(CORPUS[i : i + 3]) for i in range(0, 60, 3)] + [""]
    with open(path, "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    return path, docs[:-1]


@pytest.mark.parametrize("name", ["bert", "roberta", "t5", "qwen", "llama"])
def test_preprocess_data_with_each_tokenizer(
    name, corpus_jsonl, all_tokenizers, bert_dirs, roberta_files, t5_dir, qwen_dir, llama_dir,
    tmp_path, capsys,
):  # fmt: skip
    main = load_preprocess_main()
    jsonl, docs = corpus_jsonl
    args = {
        "bert": ["BertTokenizer", "--vocab-file", bert_dirs[True] / "vocab.txt"],
        "roberta": ["RobertaTokenizer", "--vocab-file", roberta_files[0], "--merges-file"]
        + [roberta_files[1], "--append-eod"],
        "t5": ["T5Tokenizer", "--vocab-file", t5_dir / "spiece.model", "--extra-ids", "10"]
        + ["--append-eod"],
        "qwen": ["JsonTokenizer", "--tokenizer-file", qwen_dir, "--append-eod"],
        "llama": ["JsonTokenizer", "--tokenizer-file", llama_dir / "tokenizer.json"]
        + ["--eos-token", "</s>", "--append-eod"],
    }[name]
    out = tmp_path / "out"
    argv = ["--input", jsonl, "--tokenizer-name", *args, "--output-prefix", out, "--no-progress"]
    assert main([str(a) for a in argv] + ["--workers", "2"]) == 0, capsys.readouterr().err
    tok = all_tokenizers[name]
    ds = MMapIndexedDataset(f"{out}_text_document")
    assert len(ds) == len(docs)
    eod = [tok.eod] if name != "bert" else []
    for i, doc in enumerate(docs):
        assert ds[i].tolist() == tok.encode(doc, add_special_tokens=False) + eod
    assert ds.dtype == np.uint16
    assert (
        main([str(a) for a in argv] + ["--workers", "1", "--output-prefix", str(tmp_path / "one")])
        == 0
    )
    for ext in (".bin", ".idx"):  # the same bytes whatever the number of workers
        assert (
            Path(f"{out}_text_document{ext}").read_bytes()
            == Path(f"{tmp_path}/one_text_document{ext}").read_bytes()
        )


def test_preprocess_bert_split_sentences(bert_dirs, tmp_path, capsys):
    main = load_preprocess_main()
    rng = random.Random(1)
    words = [w for w in _WORDS if w.isalpha() and w.islower()]
    sentences = [
        " ".join(rng.choice(words) for _ in range(8)).capitalize() + rng.choice(".!?")
        for _ in range(30)
    ]
    docs = [" ".join(sentences[i : i + 3]) for i in range(0, 27, 3)]
    docs.append("\n".join(sentences[27:30]))  # one sentence per line
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs + [""]))
    vocab = bert_dirs[False] / "vocab.txt"
    argv = ["--input", jsonl, "--tokenizer-name", "BertTokenizer", "--vocab-file", vocab]
    argv += ["--no-do-lower-case", "--split-sentences", "--output-prefix", tmp_path / "bert"]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    tok = BertTokenizer(vocab, do_lower_case=False)
    ds = MMapIndexedDataset(f"{tmp_path}/bert_text_sentence")
    sentences = [split_sentences(doc) for doc in docs]
    assert all(len(s) == 3 for s in sentences)  # each doc holds three sentences
    assert ds.doc_idx.tolist() == np.cumsum([0] + [len(s) for s in sentences]).tolist()
    flat = [s for doc in sentences for s in doc]
    assert len(ds) == len(flat)
    for i, sentence in enumerate(flat):
        assert ds[i].tolist() == tok.encode(sentence)
    assert "Hello" in tok.decode(tok.encode("Hello"))  # cased vocabulary kept the case


def test_preprocess_bad_tokenizer_arguments(corpus_jsonl, bert_dirs, t5_dir, tmp_path, capsys):
    main = load_preprocess_main()
    jsonl, _ = corpus_jsonl
    base = ["--input", str(jsonl), "--output-prefix", str(tmp_path / "o")]
    vocab = str(bert_dirs[True] / "vocab.txt")
    for argv in (
        ["--tokenizer-name", "BertTokenizer"],  # no --vocab-file
        ["--tokenizer-name", "JsonTokenizer", "--vocab-file", vocab],  # no --tokenizer-file
        ["--tokenizer-name", "BertTokenizer", "--vocab-file", vocab, "--extra-ids", "3"],
        ["--tokenizer-name", "T5Tokenizer", "--vocab-file", vocab, "--no-do-lower-case"],
    ):
        with pytest.raises(SystemExit):
            main(base + argv)
    capsys.readouterr()

    def fails(argv, message):
        assert main(base + argv) == 1
        err = capsys.readouterr().err
        assert message in err, err

    fails(["--tokenizer-name", "BertTokenizer", "--vocab-file", vocab, "--append-eod"],
          "BertTokenizer has no end-of-document token")  # fmt: skip
    fails(["--tokenizer-name", "T5Tokenizer", "--vocab-file", str(tmp_path / "sp.model")],
          "sp.model does not exist")  # fmt: skip
    fails(["--tokenizer-name", "JsonTokenizer", "--tokenizer-file", str(tmp_path / "tok")],
          "tok does not exist")  # fmt: skip
    fails(["--tokenizer-name", "T5Tokenizer", "--vocab-file", vocab],
          "cannot load the sentencepiece model")  # fmt: skip
    assert not list(tmp_path.glob("o_*"))  # nothing half-written is left behind
