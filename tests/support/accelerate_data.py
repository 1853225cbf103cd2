"""Tiny local Hugging Face model directories (random weights, tokenizers trained here) and
small data files for every task of libai.accelerate. Nothing is downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import transformers

WORDS = "the a movie film plot was is very quite long short story actor scene music".split()
NAMES = ["alice", "bob", "carol"]
PLACES = ["paris", "london", "rome"]
SPECIAL_WP = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIAL_BPE = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TINY = dict(hidden=32, layers=2, heads=4, ffn=64)


def _sentence(rng: random.Random, n: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def corpus(n: int = 200) -> list[str]:
    rng = random.Random(0)
    lines = [_sentence(rng, 8) for _ in range(n)]
    lines += [f"{a} went to {p} good bad" for a in NAMES for p in PLACES]
    lines += ["copy : " + _sentence(rng, 3) for _ in range(20)]
    return lines


def _wordpiece(out: Path) -> transformers.PreTrainedTokenizerBase:
    from tokenizers import BertWordPieceTokenizer

    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(corpus(), vocab_size=120, special_tokens=SPECIAL_WP, show_progress=False)
    wp.save_model(str(out))
    # transformers 5: `vocab=` (vocab_file= is silently ignored)
    tok = transformers.BertTokenizerFast(vocab=str(out / "vocab.txt"))
    assert len(tok) > 50, len(tok)
    return tok


def _bytelevel(out: Path, specials=SPECIAL_BPE) -> tuple[Path, Path]:
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=300, special_tokens=specials, show_progress=False)
    bpe.save_model(str(out))
    return out / "vocab.json", out / "merges.txt"


def bert_dir(root: Path) -> Path:
    """BERT with a pooler (``BertForPreTraining``): the zoo's classifier and the
    transformers masked LM load it."""
    out = root / "bert"
    out.mkdir(parents=True)
    tok = _wordpiece(out)
    config = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=TINY["hidden"],
        num_hidden_layers=TINY["layers"],
        num_attention_heads=TINY["heads"],
        intermediate_size=TINY["ffn"],
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    transformers.BertForPreTraining(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def distilbert_dir(root: Path) -> Path:
    """DistilBERT: outside libai's zoo (the transformers module itself is trained)."""
    out = root / "distilbert"
    out.mkdir(parents=True)
    tok = _wordpiece(out)
    config = transformers.DistilBertConfig(
        vocab_size=len(tok),
        dim=TINY["hidden"],
        n_layers=TINY["layers"],
        n_heads=TINY["heads"],
        hidden_dim=TINY["ffn"],
        max_position_embeddings=128,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,  # the heads the tasks add: no dropout either, so layouts
        qa_dropout=0.0,  # compare with one process exactly
    )
    transformers.DistilBertForMaskedLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def roberta_dir(root: Path) -> Path:
    out = root / "roberta"
    out.mkdir(parents=True)
    vocab, merges = _bytelevel(out)
    tok = transformers.RobertaTokenizerFast(vocab=str(vocab), merges=str(merges))
    assert len(tok) > 250, len(tok)
    config = transformers.RobertaConfig(
        vocab_size=len(tok),
        hidden_size=TINY["hidden"],
        num_hidden_layers=TINY["layers"],
        num_attention_heads=TINY["heads"],
        intermediate_size=TINY["ffn"],
        max_position_embeddings=140,
        pad_token_id=tok.pad_token_id,
        bos_token_id=0,
        eos_token_id=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    transformers.RobertaForMaskedLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _gpt2_tokenizer(out: Path):
    """GPT-2's byte-level BPE trained here into ``out`` (made), padding with its eos."""
    out.mkdir(parents=True)
    vocab, merges = _bytelevel(out, ["<|endoftext|>"])
    tok = transformers.GPT2TokenizerFast(vocab=str(vocab), merges=str(merges))
    tok.pad_token = tok.eos_token
    return tok


def gpt2_dir(root: Path) -> Path:
    out = root / "gpt2"
    tok = _gpt2_tokenizer(out)
    assert len(tok) > 250, len(tok)
    config = transformers.GPT2Config(
        vocab_size=len(tok),
        n_embd=TINY["hidden"],
        n_layer=TINY["layers"],
        n_head=TINY["heads"],
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def mixtral_dir(root: Path) -> Path:
    """A tiny Mixtral (4 experts, top-2) with GPT-2's byte-level tokenizer."""
    out = root / "mixtral"
    tok = _gpt2_tokenizer(out)
    config = transformers.MixtralConfig(
        vocab_size=len(tok),
        hidden_size=TINY["hidden"],
        intermediate_size=2 * TINY["hidden"],
        num_hidden_layers=TINY["layers"],
        num_attention_heads=TINY["heads"],
        num_key_value_heads=TINY["heads"],
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def t5_dir(root: Path) -> Path:
    """T5 with a WordPiece-free BPE tokenizer whose pad is id 0 and eos id 1 (T5's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    out = root / "t5"
    out.mkdir(parents=True)
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False
    )
    raw.train_from_iterator(corpus(), trainer)
    raw.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", raw.token_to_id("</s>"))]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    config = transformers.T5Config(
        vocab_size=len(tok),
        d_model=TINY["hidden"],
        d_kv=8,
        d_ff=TINY["ffn"],
        num_layers=TINY["layers"],
        num_heads=TINY["heads"],
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    transformers.T5ForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---- data files ------------------------------------------------------------------------------
def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def classification_csv(root: Path, n: int = 96) -> tuple[Path, Path]:
    """Sentence pairs labelled "pos" when the first says good, "neg" when it says bad."""
    import csv

    rng = random.Random(1)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        first = _sentence(rng, 4) + (" good" if label else " bad")
        rows.append((first, _sentence(rng, 4), "pos" if label else "neg"))
    paths = []
    for name, part in (("train.csv", rows[: n - 32]), ("dev.csv", rows[n - 32 :])):
        with open(root / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(part)
        paths.append(root / name)
    return paths[0], paths[1]


def ner_jsonl(root: Path, n: int = 64) -> tuple[Path, Path]:
    """Words with BIO tags: names are PER, places LOC."""
    rng = random.Random(2)
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(6):
            kind = rng.random()
            if kind < 0.2:
                tokens.append(rng.choice(NAMES))
                tags.append("B-PER")
            elif kind < 0.4:
                tokens += [rng.choice(PLACES), rng.choice(PLACES)]
                tags += ["B-LOC", "I-LOC"]
            else:
                tokens.append(rng.choice(WORDS))
                tags.append("O")
        rows.append({"tokens": tokens, "ner_tags": tags})
    return _jsonl(root / "ner_train.jsonl", rows[:48]), _jsonl(root / "ner_dev.jsonl", rows[48:])


def qa_jsonl(root: Path, n: int = 64) -> tuple[Path, Path]:
    """Where did NAME go? — the place in the context."""
    rng = random.Random(3)
    rows = []
    for _ in range(n):
        name, place = rng.choice(NAMES), rng.choice(PLACES)
        context = f"{_sentence(rng, 3)} {name} went to {place} {_sentence(rng, 3)}"
        rows.append(
            {
                "question": f"where did {name} go",
                "context": context,
                "answers": {"text": [place], "answer_start": [context.index(f"to {place}") + 3]},
            }
        )
    return _jsonl(root / "qa_train.jsonl", rows[:48]), _jsonl(root / "qa_dev.jsonl", rows[48:])


def text_files(root: Path) -> tuple[Path, Path]:
    """Plain text: the training part as parquet, the evaluation part as a
    ``datasets.save_to_disk`` directory (two of the accepted formats)."""
    import datasets

    lines = corpus(240)
    datasets.Dataset.from_dict({"text": lines[:200]}).to_parquet(str(root / "text.parquet"))
    datasets.Dataset.from_dict({"text": lines[200:]}).save_to_disk(str(root / "text_dev"))
    return root / "text.parquet", root / "text_dev"


def seq2seq_jsonl(root: Path, n: int = 64) -> tuple[Path, Path]:
    rng = random.Random(4)
    rows = []
    for _ in range(n):
        words = _sentence(rng, 3)
        rows.append({"source": f"copy : {words}", "target": words})
    return _jsonl(root / "s2s_train.jsonl", rows[:48]), _jsonl(root / "s2s_dev.jsonl", rows[48:])


def pretraining_prefix(root: Path, gpt2: Path) -> str:
    """A Megatron .bin/.idx corpus written with the GPT-2 directory's tokenizer files."""
    from libai.data.preprocess import preprocess_jsonl

    src = _jsonl(
        root / "corpus.jsonl", [{"text": " ".join(corpus()[i : i + 4])} for i in range(200)]
    )
    prefixes = preprocess_jsonl(
        src,
        str(root / "pretrain"),
        vocab_file=str(gpt2 / "vocab.json"),
        merges_file=str(gpt2 / "merges.txt"),
        append_eod=True,
        progress=False,
    )
    return prefixes["text"]
