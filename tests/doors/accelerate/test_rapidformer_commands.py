"""Rapidformer's documented black-box commands (../shared/peer-docs/rapidformer-training-
acceleration.txt) as written, with ``libai-accelerate`` for ``rapidformer`` and the Hub names
replaced by local stand-ins of the same shape (rapidformer_stand_ins): the GLUE/MRPC
fine-tune, BERT pretraining from Megatron's flags on data built by tools/preprocess_data.py
with Megatron's flag names, FSDP with tied weights on dp2, and ``--load`` of a Hugging Face
directory. Every loss is compared with transformers' own on the same batch."""

from __future__ import annotations

import json
import math
import runpy
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from launch import torchrun
from log_lines import LogLines
from rapidformer_stand_ins import (
    BERT_VOCAB,
    bert_base_cased,
    bert_vocab,
    corpus_jsonl,
    glue_repo,
    gpt2_files,
)
from train_net_helpers import ROOT, read_metrics

from libai import dist
from libai.accelerate import cli
from libai.accelerate.data import build_loader
from libai.accelerate.hub_data import infer_text_columns, load_data
from libai.accelerate.pretraining import bert_pretraining_datasets

#: the documented fine-tune, in its order; only the batch is shrunk (same flags)
FINETUNE = (
    "--task sequence_classification --pretrained-model-name-or-path {model} --data-path {glue} "
    "--data-name mrpc --epochs 1 --micro-batch-size 8 --global-batch-size 16 --lr 2e-5 "
    "--lr-decay-style linear --lr-warmup-iters 100 --weight-decay 1e-2 --clip-grad 1.0 "
    "--seed 42 --mixed-precision --onnx-runtime-training --zero-1-memory-optimization"
)
#: the documented pretraining (--pretrained-model-name-or-path dropped: the model is built
#: from the flags; sizes shrunk; dropout off so a step's loss is reproducible)
PRETRAIN = (
    "--task pretraining --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
    "--micro-batch-size 4 --global-batch-size 8 --seq-length 32 --tokenizer-type {tok} "
    "--max-position-embeddings 64 --train-iters 2 --data-path {data} --vocab-file {vocab} "
    "--data-impl mmap --split 980,20 --lr 1e-3 --lr-decay-style linear --min-lr 0.0 "
    "--lr-decay-iters 2000 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 "
    "--hidden-dropout 0 --attention-dropout 0 --eval-iters 1"
)
COMMON = ["--log-interval", "1", "--seq-length", "16"]


def preprocess(argv: list[str]) -> None:
    script = runpy.run_path(str(ROOT / "tools" / "preprocess_data.py"))
    assert script["main"](argv) == 0


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    root = tmp_path_factory.mktemp("rapidformer")
    files = {"model": bert_base_cased(root), "glue": glue_repo(root), "vocab": bert_vocab(root)}
    corpus = corpus_jsonl(root)
    # Megatron's flag names, as the documentation's preprocessing command writes them
    preprocess(
        [
            "--input", str(corpus), "--output-prefix", str(root / "bert"), "--vocab",
            str(files["vocab"]), "--dataset-impl", "mmap", "--tokenizer-type",
            "BertWordPieceLowerCase", "--split-sentences", "--workers", "1", "--json-keys",
            "text", "--no-progress",
        ]
    )  # fmt: skip
    files["bert_data"] = root / "bert_text_sentence"
    vocab, merges = gpt2_files(root)
    preprocess(
        [
            "--input", str(corpus), "--output-prefix", str(root / "gpt"), "--vocab", str(vocab),
            "--dataset-impl", "mmap", "--tokenizer-type", "GPT2BPETokenizer", "--merge-file",
            str(merges), "--append-eod", "--no-progress",
        ]
    )  # fmt: skip
    files.update(gpt_data=root / "gpt_text_document", gpt_vocab=vocab, gpt_merges=merges)
    files["root"] = root
    return files


def first_loss(out) -> float:
    return read_metrics(out)[0]["total_loss"]


def run_cli(argv: list[str]) -> None:
    dist.setup_dist_util({})
    assert cli.main(argv) == 0


@pytest.fixture
def cheap_compile(monkeypatch):
    """--onnx-runtime-training compiles each block: here with TorchDynamo's eager backend
    (the blocks are traced and run as graphs; Inductor's code generation, a cold ~10 s on
    CPU, is skipped; test_accelerate_switches covers the real compile)."""
    compile_module = torch.nn.Module.compile

    def compile_eager(self, *args, **kwargs):
        return compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eager)


# ---- data like datasets users expect ------------------------------------------------------
def test_a_glue_shaped_repo_loads_with_its_splits_and_columns(stand_ins, tmp_path):
    import datasets

    splits = load_data(str(stand_ins["glue"]), "mrpc")
    want = datasets.load_dataset(str(stand_ins["glue"]), "mrpc", cache_dir=str(tmp_path))
    assert sorted(splits) == ["test", "train", "validation"]
    for name, split in splits.items():
        assert split.to_dict() == want[name].to_dict(), name
    assert infer_text_columns(splits["train"].column_names) == ["sentence1", "sentence2"]
    qnli = load_data(str(stand_ins["glue"]), "qnli")["train"]
    assert infer_text_columns(qnli.column_names) == ["question", "sentence"]
    for columns, want_cols in (
        (["premise", "hypothesis", "label"], ["premise", "hypothesis"]),
        (["question1", "question2", "label"], ["question1", "question2"]),
        (["question", "passage", "label"], ["question", "passage"]),
        (["sentence", "label", "idx"], ["sentence"]),
    ):
        assert infer_text_columns(columns) == want_cols
    with pytest.raises(ValueError, match=r"give --text-columns A\[,B\]"):
        infer_text_columns(["a", "b", "label"])
    saved = tmp_path / "saved"
    want.save_to_disk(str(saved))
    assert load_data(str(saved))["validation"].to_dict() == want["validation"].to_dict()


def test_hub_ids_come_from_the_hugging_face_cache_offline(stand_ins, tmp_path, monkeypatch):
    """``--data-path glue --data-name mrpc`` and a model id read the caches (a private one
    here), with the hub offline: no download is tried."""
    import shutil

    import datasets
    import huggingface_hub

    from libai.accelerate.hub_data import resolve_model_dir

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.chdir(stand_ins["glue"].parent)  # "glue" is the repository once: cache it
    datasets.load_dataset("glue", "mrpc")
    monkeypatch.chdir(tmp_path)  # now "glue" names no directory: a Hub id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    splits = load_data("glue", "mrpc")
    assert sorted(splits) == ["test", "train", "validation"] and len(splits["train"]) == 16
    # a model snapshot as the Hub cache lays it out: models--org--name/snapshots/<rev>/
    repo = tmp_path / "hub" / "models--google-bert--bert-base-cased"
    shutil.copytree(stand_ins["model"], repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    found = resolve_model_dir("google-bert/bert-base-cased")
    assert (tmp_path / "hub").resolve() in Path(found).resolve().parents
    assert transformers.BertForSequenceClassification.from_pretrained(found).num_labels == 2
    with pytest.raises(FileNotFoundError, match="neither a local model directory nor a Hub"):
        resolve_model_dir("google-bert/bert-base-uncased")


# ---- the documented fine-tune ---------------------------------------------------------------
def glue_reference_loss(stand_ins, autocast: bool) -> float:
    """transformers' loss of the stand-in model on the whole MRPC train split (16 rows: the
    first global batch whatever the order; dropout is off) at the seq length of COMMON."""
    import datasets

    with tempfile.TemporaryDirectory() as cache:  # never the user's ~/.cache
        rows = datasets.load_dataset(
            str(stand_ins["glue"]), "mrpc", split="train", cache_dir=cache, keep_in_memory=True
        )
    tok = transformers.AutoTokenizer.from_pretrained(stand_ins["model"])
    enc = tok(
        list(rows["sentence1"]),
        list(rows["sentence2"]),
        padding="max_length",
        max_length=16,
        truncation=True,
        return_tensors="pt",
    )
    model = transformers.BertForSequenceClassification.from_pretrained(stand_ins["model"])
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        return float(model(**enc, labels=torch.tensor(list(rows["label"]))).loss)


def test_the_documented_finetune_runs_as_written(stand_ins, tmp_path, cheap_compile):
    """All the documented flags on one process (ZeRO-1 a no-op there, with one line): MRPC's
    train split trains, its validation split evaluates, and the first step's loss is
    transformers' on that batch (bf16 autocast on both sides; fp32 without the two switches,
    to rounding)."""
    argv = FINETUNE.format(**stand_ins).split()
    with LogLines("libai.accelerate") as lines:
        run_cli([*argv, *COMMON, "--save", str(tmp_path / "as_written")])
    zero = [line for line in lines if line.startswith("--zero-1-memory-optimization")]
    assert zero == [
        "--zero-1-memory-optimization: one data-parallel rank, nothing to shard over; running "
        "without ZeRO"
    ]
    assert any("text columns ['sentence1', 'sentence2'] (inferred" in line for line in lines)
    metrics = read_metrics(tmp_path / "as_written")
    last = metrics[max(metrics)]
    assert len(metrics) == 1  # 16 rows / global batch 16 x 1 epoch
    assert set(last) >= {"eval_accuracy", "eval_f1"}, last
    assert (last["eval_accuracy"] * 8) == pytest.approx(round(last["eval_accuracy"] * 8))
    reference = glue_reference_loss(stand_ins, autocast=True)
    assert first_loss(tmp_path / "as_written") == pytest.approx(reference, abs=2e-2)
    # fp32: the same command without --mixed-precision / --onnx-runtime-training
    fp32 = [a for a in argv if a not in ("--mixed-precision", "--onnx-runtime-training")]
    run_cli([*fp32, *COMMON, "--save", str(tmp_path / "fp32")])
    got, want = first_loss(tmp_path / "fp32"), glue_reference_loss(stand_ins, autocast=False)
    assert abs(want - math.log(2)) > 1e-3  # the rows' logits differ: a real comparison
    assert got == pytest.approx(want, abs=1e-5)
    exported = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "fp32/hf")
    assert exported.config.num_labels == 2


# ---- pretraining from Megatron's flags ----------------------------------------------------------
def first_batch(dataset, args_seed: int, size: int) -> dict:
    """The run's first global batch: the loader the black box builds (same seed)."""
    loader = build_loader(dataset, size, train=True, seed=args_seed)
    return next(iter(loader))


def test_bert_pretraining_trains_masked_lm_and_next_sentence(stand_ins, tmp_path):
    """The documented BERT pretraining: BertForPreTraining built from the flags; the first
    step's loss is transformers' (masked LM + next sentence) on the first batch of BERT
    samples; the result loads with BertForPreTraining.from_pretrained."""
    data, vocab = stand_ins["bert_data"], stand_ins["vocab"]
    argv = PRETRAIN.format(tok="BertWordPieceLowerCase", data=data, vocab=vocab).split()
    out = tmp_path / "bert"
    run_cli([*argv, "--log-interval", "1", "--seed", "42", "--save", str(out)])
    tok = transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    config = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(42)
    reference = transformers.BertForPreTraining(config)
    evals = 2  # (train_iters // eval period + 1) x eval_iters
    train, _, _ = bert_pretraining_datasets(
        str(data), tok, train_valid_test_num_samples=[16, evals * 8, 0], max_seq_length=32,
        masked_lm_prob=0.15, seed=42,
    )  # fmt: skip
    batch = first_batch(train, 42, 8)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels",
                          "next_sentence_label"}  # fmt: skip
    assert (batch["labels"] != -100).any() and set(batch["next_sentence_label"].tolist()) <= {0, 1}
    with torch.no_grad():
        outputs = reference(**batch)
    want = float(outputs.loss)
    ce = torch.nn.functional.cross_entropy
    mlm = ce(outputs.prediction_logits.flatten(0, 1), batch["labels"].flatten())
    nsp = ce(outputs.seq_relationship_logits, batch["next_sentence_label"])
    assert want == pytest.approx(float(mlm + nsp), abs=1e-5) and float(nsp) > 0.1  # both
    assert first_loss(out) == pytest.approx(want, abs=1e-5)
    saved = transformers.BertForPreTraining.from_pretrained(out / "hf")
    assert saved.config.num_hidden_layers == 2 and saved.config.hidden_size == 32
    assert saved.cls.predictions.decoder.weight is saved.bert.embeddings.word_embeddings.weight
    last = read_metrics(out)[max(read_metrics(out))]
    assert {"eval_perplexity", "eval_next_sentence_accuracy"} <= set(last), last


def test_black_box_bert_samples_take_megatron_short_seq_prob(stand_ins):
    """``--short-seq-prob`` (Megatron's flag, on the parser when a script adds it) decides
    the BERT samples, 0.0 included (no short samples); absent, Megatron's default 0.1.
    Megatron's ``--mask-prob``, when there, wins over ``--mlm-probability``. The samples
    equal those ``bert_pretraining_datasets`` builds with those probabilities."""
    from types import SimpleNamespace

    from libai.accelerate.pretraining import bert_black_box_datasets, megatron_ids

    data, vocab = str(stand_ins["bert_data"]), stand_ins["vocab"]
    tok = transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    flags = dict(data_path=data, data_impl="mmap", split="980,20", seq_length=32, seed=42)

    def ids(train):
        return [train[i]["input_ids"].tolist() for i in range(16)]

    def direct(probability, masked=0.15):
        train, _, _ = bert_pretraining_datasets(
            data, tok, train_valid_test_num_samples=[16, 8, 0], max_seq_length=32,
            masked_lm_prob=masked, short_seq_prob=probability, seed=42,
        )  # fmt: skip
        return ids(train)

    def black_box(**extra):
        args = SimpleNamespace(**flags, mlm_probability=0.15, **extra)
        return ids(bert_black_box_datasets(args, tok, [16, 8])[0])

    assert direct(1.0) != direct(0.1)  # the flag shows in the samples
    # any object with Megatron's ids stands for the tokenizer
    megatron, _, _ = bert_pretraining_datasets(
        data, megatron_ids(tok), train_valid_test_num_samples=[16, 8, 0], max_seq_length=32,
        masked_lm_prob=0.15, short_seq_prob=0.1, seed=42,
    )  # fmt: skip
    assert ids(megatron) == direct(0.1)
    assert black_box() == direct(0.1)
    assert black_box(short_seq_prob=1.0) == direct(1.0)
    assert black_box(short_seq_prob=0.0) == direct(0.0)
    assert direct(0.1, masked=0.5) != direct(0.1)
    assert black_box(mask_prob=0.5) == direct(0.1, masked=0.5)


def test_the_documented_pretraining_runs_as_written(stand_ins, tmp_path, cheap_compile):
    """Every flag of the documented command, --pretrained-model-name-or-path included (its
    config under Megatron's flags) and --fsdp-memory-optimization (one rank: a no-op)."""
    data, vocab = stand_ins["bert_data"], stand_ins["vocab"]
    argv = PRETRAIN.format(tok="BertWordPieceLowerCase", data=data, vocab=vocab).split()
    model = ["--pretrained-model-name-or-path", str(stand_ins["model"])]
    switches = ["--mixed-precision", "--onnx-runtime-training", "--fsdp-memory-optimization"]
    out = tmp_path / "as_written"
    run_cli([*argv[:2], *model, *argv[2:], *switches, "--log-interval", "1", "--save", str(out)])
    saved = transformers.BertForPreTraining.from_pretrained(out / "hf")
    assert saved.config.initializer_range == 0.2  # the model directory's setting
    assert saved.config.num_hidden_layers == 2 and saved.config.intermediate_size == 128
    assert len(read_metrics(out)) == 2


def test_preprocess_data_takes_megatron_flag_names(stand_ins, tmp_path):
    """--tokenizer-type / --vocab / --merge-file write the very files of libai's names."""
    corpus = stand_ins["root"] / "book_wiki_owtv2_small.json"
    common = ["--input", str(corpus), "--no-progress", "--workers", "1"]
    preprocess(
        [*common, "--output-prefix", str(tmp_path / "bert"), "--tokenizer-name", "BertTokenizer",
         "--vocab-file", str(stand_ins["vocab"]), "--do-lower-case", "--split-sentences"]
    )  # fmt: skip
    preprocess(
        [*common, "--output-prefix", str(tmp_path / "gpt"), "--tokenizer-name", "GPT2Tokenizer",
         "--vocab-file", str(stand_ins["gpt_vocab"]), "--merges-file",
         str(stand_ins["gpt_merges"]), "--append-eod"]
    )  # fmt: skip
    for ours, megatron in (("bert_text_sentence", "bert_text_sentence"),
                           ("gpt_text_document", "gpt_text_document")):  # fmt: skip
        for ext in (".bin", ".idx"):
            mine = (tmp_path / (ours + ext)).read_bytes()
            assert mine == (stand_ins["root"] / (megatron + ext)).read_bytes(), ours + ext
    script = runpy.run_path(str(ROOT / "tools" / "preprocess_data.py"))
    with pytest.raises(SystemExit):  # argparse: one line naming the flags
        script["get_args"](["--input", str(corpus), "--output-prefix", str(tmp_path / "x")])


def test_gpt2_bpe_pretraining_trains_a_causal_lm(stand_ins, tmp_path):
    data = stand_ins["gpt_data"]
    argv = PRETRAIN.format(tok="GPT2BPETokenizer", data=data, vocab=stand_ins["gpt_vocab"]).split()
    out = tmp_path / "gpt"
    merges = ["--merge-file", str(stand_ins["gpt_merges"])]
    run_cli([*argv, *merges, "--log-interval", "1", "--save", str(out)])
    saved = transformers.GPT2LMHeadModel.from_pretrained(out / "hf")
    assert saved.config.n_layer == 2 and saved.config.n_embd == 32
    tok = transformers.GPT2TokenizerFast(
        vocab=str(stand_ins["gpt_vocab"]), merges=str(stand_ins["gpt_merges"])
    )
    config = transformers.GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(1234)
    reference = transformers.GPT2LMHeadModel(config)
    from libai.accelerate.data import pretraining_datasets

    args = cli.parse_args([*argv, "--merge-file", str(stand_ins["gpt_merges"])])
    train, _ = pretraining_datasets(args, [16, 16])
    ids = first_batch(train, 1234, 8)["input_ids"]
    with torch.no_grad():
        want = float(reference(input_ids=ids, labels=ids).loss)
    assert first_loss(out) == pytest.approx(want, abs=1e-5)


def test_config_file_flags_equal_the_same_flags_on_the_command_line(stand_ins, tmp_path):
    """``--config-file FILE`` (what tools/train.sh passes): FILE's flags, comments and line
    breaks allowed, parse exactly as if written first on the command line, so a flag given
    after them wins; ``-`` is no file; a missing file is named."""
    argv = PRETRAIN.format(
        tok="BertWordPieceLowerCase", data=stand_ins["bert_data"], vocab=stand_ins["vocab"]
    ).split()
    half = len(argv) // 2
    config = tmp_path / "pretrain.args"
    config.write_text(
        "# Rapidformer flags\n" + " ".join(argv[:half]) + "\n" + " ".join(argv[half:]) + "\n",
        encoding="utf-8",
    )
    direct = cli.parse_args([*argv, "--lr", "5e-4"])
    from_file = cli.parse_args(["--config-file", str(config), "--lr", "5e-4"])
    assert vars(from_file) == vars(direct) and direct.lr == 5e-4
    assert vars(cli.parse_args(["--config-file", "-", *argv])) == vars(cli.parse_args(argv))
    missing = tmp_path / "missing.args"
    with pytest.raises(FileNotFoundError, match=f"--config-file {missing} does not exist"):
        cli.parse_args(["--config-file", str(missing), *argv])


@pytest.mark.parametrize(
    "dropped", [["--hidden-size"], ["--hidden-size", "--num-attention-heads"]], ids=["one", "two"]
)
def test_megatron_model_flags_left_out_are_named_as_typed(dropped):
    """The documented pretraining command without some of Megatron's model flags: the error
    names exactly those flags, spelled as on the command line."""
    words = PRETRAIN.format(tok="BertWordPieceLowerCase", data="data", vocab="vocab.txt").split()
    for flag in dropped:
        i = words.index(flag)
        del words[i : i + 2]
    with pytest.raises(ValueError, match=f"from Megatron's flags also needs {', '.join(dropped)}$"):
        cli.parse_args(words)


# ---- --load: a Hugging Face directory or a checkpoint ---------------------------------------
def test_load_takes_a_hugging_face_directory_or_a_checkpoint(stand_ins, tmp_path):
    """``--load DIR`` of a save_pretrained directory starts from its weights at step 0 (the
    first loss is that model's, not the --pretrained-model-name-or-path one's); ``--load`` of
    a run's output resumes it."""
    other = tmp_path / "other"
    torch.manual_seed(5)
    model = transformers.BertForSequenceClassification.from_pretrained(stand_ins["model"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(other)
    transformers.AutoTokenizer.from_pretrained(stand_ins["model"]).save_pretrained(other)
    argv = FINETUNE.format(**stand_ins).split()
    fp32 = [a for a in argv if a not in ("--mixed-precision", "--onnx-runtime-training")]
    with LogLines("libai.accelerate") as lines:
        run_cli([*fp32, *COMMON, "--save", str(tmp_path / "hf_load"), "--load", str(other)])
    assert any(f"--load {other}: a Hugging Face model directory" in line for line in lines)
    ref = dict(stand_ins, model=other)
    assert first_loss(tmp_path / "hf_load") == pytest.approx(
        glue_reference_loss(ref, autocast=False), abs=1e-5
    )
    # a run's output directory: resumed (here: already at its last step)
    done = tmp_path / "hf_load"
    with LogLines("libai") as lines:  # the door's line, and the run's (libai.runtime.run)
        run_cli([*fp32, *COMMON, "--save", str(tmp_path / "resumed"), "--load", str(done)])
    assert any(f"--load {done}: a checkpoint: resuming" in line for line in lines), lines
    assert any("Nothing left to train" in line for line in lines), lines


# ---- FSDP with tied weights on dp2 ------------------------------------------------------------
def test_fsdp_units_leave_a_block_tied_to_the_root_to_the_root():
    """transformers' BertForPreTraining: the embedding block holds the word embedding the
    MLM decoder (on the root) ties; FSDP's units leave that block to the root, keep the
    layers, and every parameter is in exactly one unit."""
    from libai.runtime.blocks import model_blocks
    from libai.runtime.fsdp import blocks_tied_to_root_merged, check_fsdp_units

    config = transformers.BertConfig(
        vocab_size=len(BERT_VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    model = transformers.BertForPreTraining(config)
    blocks = model_blocks(model)
    assert model.bert.embeddings in blocks
    with pytest.raises(ValueError, match="used by block bert.embeddings and outside the blocks"):
        check_fsdp_units(model, blocks)
    units = blocks_tied_to_root_merged(model, blocks)
    assert units == list(model.bert.encoder.layer)
    check_fsdp_units(model, units)


def test_fsdp_shards_tied_weights_and_equals_plain_data_parallel(stand_ins, tmp_path):
    """BertForPreTraining (decoder tied to the word embedding) on 2 ranks: with
    --fsdp-memory-optimization the tied weight is sharded with the root's unit, each rank
    holds half the parameters, and the loss of every step and every gradient equal plain
    data parallel; the documented pretraining command with the switch gives the losses of
    the command without it. In the same launch the documented fine-tune on dp2 (ZeRO-1
    sharding) starts from transformers' loss on the global batch."""
    data, vocab = stand_ins["bert_data"], stand_ins["vocab"]
    argv = PRETRAIN.format(tok="BertWordPieceLowerCase", data=data, vocab=vocab).split()
    config = dict(
        vocab_size=len(BERT_VOCAB), hidden_size=32,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    spec = {
        "compose_argv": [*argv, "--clip-grad", "0", "--save", str(tmp_path / "compose")],
        "config": config,
        "compose": {"plain": [], "fsdp": ["--fsdp-memory-optimization"]},
        "cli": {
            name: [*argv, "--log-interval", "1", "--save", str(tmp_path / name), *flags]
            for name, flags in (("cli_plain", []), ("cli_fsdp", ["--fsdp-memory-optimization"]))
        },
    }
    # the documented fine-tune on 2 ranks (ZeRO-1 now shards), fp32: micro 8 x 2 = global 16
    finetune = FINETUNE.format(**stand_ins).split()
    finetune = [a for a in finetune if a not in ("--mixed-precision", "--onnx-runtime-training")]
    spec["cli"]["finetune_dp2"] = [*finetune, *COMMON, "--save", str(tmp_path / "finetune_dp2")]
    results = torchrun("accelerate_tied.py", 2, json.dumps(spec))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    plain, fsdp = results[0]["plain"], results[0]["fsdp"]
    for r in results:
        assert r["fsdp"]["tied"] and r["fsdp"]["sharded"] and not r["plain"]["sharded"]
        assert r["fsdp"]["losses"] == pytest.approx(r["plain"]["losses"], abs=1e-6)
    assert sum(r["fsdp"]["local_numel"] for r in results) == plain["local_numel"]
    assert max(r["fsdp"]["local_numel"] for r in results) < plain["local_numel"]
    assert set(fsdp["grads"]) == set(plain["grads"])
    for name, g in plain["grads"].items():
        assert torch.allclose(torch.tensor(fsdp["grads"][name]), torch.tensor(g), atol=1e-6), name
    assert all(r[name]["code"] == 0 for r in results for name in spec["cli"])
    got = first_loss(tmp_path / "finetune_dp2")
    assert got == pytest.approx(glue_reference_loss(stand_ins, autocast=False), abs=1e-5)
    cli_losses = {
        name: [m["total_loss"] for _, m in sorted(read_metrics(tmp_path / name).items())
               if "total_loss" in m]
        for name in ("cli_plain", "cli_fsdp")
    }  # fmt: skip
    assert cli_losses["cli_fsdp"] == pytest.approx(cli_losses["cli_plain"], abs=1e-5)
