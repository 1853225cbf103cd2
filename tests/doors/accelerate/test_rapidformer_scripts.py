"""Rapidformer's documented user scripts (../shared/peer-docs/rapidformer-training-
acceleration.txt) run by ``libai-accelerate --user-script`` as written: ``MyFintuner``,
``MyBertPreTrainer`` and the plain Hugging Face loop through ``engine.compose``. The Hub names
are local directories of the same names (the tests run in a directory holding
``bert-base-cased/``, ``bert-base-uncased/``, ``glue/``, the vocab file and Megatron data built
by tools/preprocess_data.py). What the scripts change against the page, and why, is in
``rapidformer_doc_scripts.DEVIATIONS`` and docs/accelerate.md. Losses are compared with transformers / plain PyTorch
on the same batches."""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import transformers
from launch import torchrun
from rapidformer_doc_scripts import COMPOSE_LOOP, FINETUNER, GLUE_METRIC, PRETRAINER
from rapidformer_stand_ins import bert_base_cased, bert_vocab, corpus_jsonl, glue_repo
from train_net_helpers import ROOT

from libai import dist
from libai.accelerate import cli, get_args, get_timers
from libai.accelerate.data import build_loader
from libai.accelerate.pretraining import bert_pretraining_datasets
from libai.accelerate.rapidformer_api import RapidformerEngine
from libai.accelerate.templates import trainings
from libai.accelerate.user_script import SCOPED_NAMES, run_user_script

#: the page's MyFintuner command (only --save / --log-interval added, and --load: the script
#: reads args.load, which the page's command never sets)
FINETUNE_CMD = (
    "--user-script rapidformer_finetune_huggingface_bert_trainer.py --task sequence_classification "
    "--pretrained-model-name-or-path bert-base-cased --data-path glue --data-name mrpc --epochs 3 "
    "--micro-batch-size 16 --global-batch-size 16 --lr 2e-5 --lr-decay-style linear "
    "--lr-warmup-iters 100 --weight-decay 1e-2 --clip-grad 1.0 --mixed-precision "
    "--zero-3-memory-optimization --onnx-runtime-training --load bert-base-cased"
)
#: the page's MyBertPreTrainer command, sizes shrunk, --mixed-precision off (fp32: the loss
#: is compared tightly; the fine-tune covers the switch)
PRETRAIN_CMD = (
    "--user-script rapidformer_pretrain_huggingface_bert_trainer.py --pretrained-model-name-or-path "
    "bert-base-uncased --num-layers 2 --hidden-size 32 --num-attention-heads 4 --micro-batch-size 4 "
    "--global-batch-size 8 --seq-length 32 --tokenizer-type BertWordPieceLowerCase "
    "--max-position-embeddings 64 --train-iters 2 --data-path book_wiki_owtv2_small_text_sentence "
    "--vocab-file bert-en-uncased-vocab.txt --data-impl mmap --split 980,20 --lr 1e-3 "
    "--lr-decay-style linear --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 "
    "--zero-3-memory-optimization --onnx-runtime-training"
)


def bert_base_uncased(root: Path) -> Path:
    """A tiny ``bert-base-uncased``: BertForPreTraining (dropout off) + its tokenizer."""
    out = root / "bert-base-uncased"
    tok = transformers.BertTokenizerFast(vocab=str(bert_vocab(root)), do_lower_case=True)
    tok.save_pretrained(out)
    config = transformers.BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, initializer_range=0.2, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(1)
    transformers.BertForPreTraining(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    """A directory laid out like the page's working directory (Hub names = local dirs)."""
    root = tmp_path_factory.mktemp("rapidformer_scripts")
    bert_base_cased(root)
    bert_base_uncased(root)
    glue_repo(root)
    corpus = corpus_jsonl(root)
    preprocess = runpy.run_path(str(ROOT / "tools" / "preprocess_data.py"))["main"]
    assert preprocess([
        "--input", str(corpus), "--output-prefix", str(root / "book_wiki_owtv2_small"),
        "--vocab", str(root / "bert-en-uncased-vocab.txt"), "--dataset-impl", "mmap",
        "--tokenizer-type", "BertWordPieceLowerCase", "--split-sentences", "--workers", "1",
        "--no-progress",
    ]) == 0  # fmt: skip
    (root / "glue_metric.py").write_text(GLUE_METRIC)
    for name, text in (
        ("rapidformer_finetune_huggingface_bert_trainer.py", FINETUNER),
        ("rapidformer_pretrain_huggingface_bert_trainer.py", PRETRAINER),
        ("rapidformer_compose_loop.py", COMPOSE_LOOP),
    ):
        (root / name).write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def in_here(here, monkeypatch, tmp_path):
    import datasets

    monkeypatch.chdir(here)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return here


@pytest.fixture
def cheap_compile(monkeypatch):
    """--onnx-runtime-training compiles each block: here with TorchDynamo's eager backend
    (test_accelerate_switches covers Inductor)."""
    compile_module = torch.nn.Module.compile

    def compile_eager(self, *args, **kwargs):
        return compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eager)


def metric_records(out: Path) -> list[dict]:
    """metrics.json's records in order (one per logged step; a step's evaluation results are
    in its record)."""
    return [json.loads(line) for line in (out / "metrics.json").read_text().splitlines() if line]


def run(argv: list[str]) -> None:
    dist.setup_dist_util({})
    assert cli.main(argv) == 0


def not_importable() -> None:
    for name in SCOPED_NAMES:
        assert name not in sys.modules, name
    assert importlib.util.find_spec("rapidformer") is None
    assert importlib.util.find_spec("megatron") is None


def test_my_fintuner_runs_as_written_and_trains_once(in_here, tmp_path, cheap_compile):
    """The page's MyFintuner, run by its command: the script's own trainer.train() is the
    run (3 epochs of one step, each iteration logged once), run_compute_metrics gets the
    model list (``model = model[0]``) and its metric lands in metrics.json; the first loss
    is transformers' on the same rows (the whole train split: one global batch)."""
    not_importable()
    before = trainings()
    run([*FINETUNE_CMD.split(), "--save", str(tmp_path / "out"), "--log-interval", "1"])
    assert trainings() == before + 1  # not trained a second time by the command line
    not_importable()  # the names were there only while the script ran
    records = metric_records(tmp_path / "out")
    steps = [r["iteration"] for r in records]
    assert steps == [0, 1, 2]  # one line per step: the last holds the final evaluation too
    evals = [r for r in records if "eval_accuracy" in r]
    assert len(evals) == 1 and evals[0]["iteration"] == 2
    assert set(evals[0]) >= {"eval_accuracy", "eval_f1", "total_loss"}
    assert evals[0]["eval_accuracy"] * 8 == pytest.approx(round(evals[0]["eval_accuracy"] * 8))
    import datasets

    rows = datasets.load_dataset("glue", "mrpc", split="train")
    tok = transformers.AutoTokenizer.from_pretrained("bert-base-cased")
    enc = tok(list(rows["sentence1"]), list(rows["sentence2"]), padding=True, return_tensors="pt")
    model = transformers.BertForSequenceClassification.from_pretrained("bert-base-cased")
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want = float(model(**enc, labels=torch.tensor(list(rows["label"]))).loss)
    assert steps and records[0]["total_loss"] == pytest.approx(want, abs=2e-2)


def test_my_bert_pretrainer_runs_as_written(in_here, tmp_path, cheap_compile):
    """The page's MyBertPreTrainer on Megatron data made by tools/preprocess_data.py: its
    first logged loss (2 micro-batches of 4) is transformers' BertForPreTraining (masked LM +
    next sentence) on the same samples."""
    run([*PRETRAIN_CMD.split(), "--save", str(tmp_path / "out"), "--log-interval", "1"])
    not_importable()
    records = metric_records(tmp_path / "out")
    assert [r["iteration"] for r in records] == [0, 1]
    tok = transformers.BertTokenizerFast(vocab="bert-en-uncased-vocab.txt", do_lower_case=True)
    train, _, _ = bert_pretraining_datasets(
        "book_wiki_owtv2_small_text_sentence", tok, train_valid_test_num_samples=[16, 0, 0],
        max_seq_length=32, masked_lm_prob=0.15, short_seq_prob=0.1, seed=1234,
    )  # fmt: skip
    batch = next(iter(build_loader(train, 8, train=True, seed=1234)))
    assert (batch["labels"] != -100).any() and batch["next_sentence_label"].numel() == 8
    reference = transformers.BertForPreTraining.from_pretrained("bert-base-uncased")
    with torch.no_grad():
        halves = [{k: v[i : i + 4] for k, v in batch.items()} for i in (0, 4)]
        want = sum(float(reference(**h).loss) for h in halves) / 2
    assert records[0]["total_loss"] == pytest.approx(want, abs=1e-5)


def _reference_loop(steps: int, lr: float) -> tuple[torch.nn.Module, float, float]:
    """The loop in plain PyTorch: full-batch steps on MRPC's train split (one global batch),
    AdamW with the flags (no decay on biases / norms), global-norm clipping at 1.0, the
    linear schedule; returns the model, the last loss and the validation accuracy."""
    import datasets

    tok = transformers.AutoTokenizer.from_pretrained("bert-base-cased")
    model = transformers.BertForSequenceClassification.from_pretrained("bert-base-cased")

    def encode(split):
        rows = datasets.load_dataset("glue", "mrpc", split=split)
        enc = tok(list(rows["sentence1"]), list(rows["sentence2"]), padding=True,
                  return_tensors="pt")  # fmt: skip
        return {**enc, "labels": torch.tensor(list(rows["label"]))}

    train, valid = encode("train"), encode("validation")
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() > 1], "weight_decay": 1e-2},
        {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, steps)
    model.train()
    for _ in range(steps):
        loss = model(**train).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        pred = model(**valid).logits.argmax(-1)
    return model, loss.item(), float((pred == valid["labels"]).float().mean())


def test_the_plain_loop_through_compose_equals_plain_pytorch(in_here, tmp_path):
    """The page's Hugging Face loop with its two diffs (build_data_loader, compose(model_obj=)),
    run with no --task / --pretrained-model-name-or-path / --data-path: ragged rows padded by
    the model directory's tokenizer, 3 epochs of one full-batch step; the last loss, every
    weight and each epoch's accuracy equal a plain PyTorch loop."""
    argv = ["--user-script", "rapidformer_compose_loop.py", "--micro-batch-size", "16",
            "--epochs", "3", "--train-iters", "3", "--lr", "1e-2", "--lr-warmup-iters", "0",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--save", str(tmp_path / "out")]  # fmt: skip
    dist.setup_dist_util({})
    loop = run_user_script("rapidformer_compose_loop.py", argv)
    not_importable()
    model, last_loss, accuracy = _reference_loop(3, 1e-2)
    assert loop["loss"].item() == pytest.approx(last_loss, abs=1e-5)
    start = transformers.BertForSequenceClassification.from_pretrained("bert-base-cased")
    moved = 0.0
    for (name, p), q, p0 in zip(
        loop["model"].module.named_parameters(), model.parameters(), start.parameters()
    ):
        if name.endswith("attention.self.key.bias"):
            # softmax ignores the key bias: its gradient is rounding noise, which Adam
            # scales to +-lr whatever its size, so both runs move it by noise
            continue
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-5, rtol=1e-4, msg=name)
        moved = max(moved, float((q - p0).abs().max()))
    assert moved > 1e-3  # the steps changed the weights: a real comparison
    assert loop["eval_metric"]["accuracy"] == pytest.approx(accuracy)


def test_data_loader_pads_with_the_tokenizer_and_shuffles_training(in_here, tmp_path):
    """build_data_loader without collate_fn: training data shuffled, a validation split in
    order (one pass); ragged rows padded as DataCollatorWithPadding (label -> labels) with
    the tokenizer of --pretrained-model-name-or-path, and the same without any tokenizer."""
    import datasets

    tok = transformers.AutoTokenizer.from_pretrained("bert-base-cased")
    texts = [" ".join(["the cat"] * (1 + i % 5)) for i in range(16)]
    rows = {**tok(texts), "label": [i % 2 for i in range(16)], "idx": list(range(16))}
    for with_tokenizer in (True, False):
        flags = ["--micro-batch-size", "16", "--save", str(tmp_path)]
        if with_tokenizer:
            flags += ["--pretrained-model-name-or-path", "bert-base-cased"]
        dist.setup_dist_util({})
        engine = RapidformerEngine(args=flags)
        train = datasets.Dataset.from_dict(rows, split="train")
        valid = datasets.Dataset.from_dict(rows, split="validation")
        batch = next(iter(engine.build_data_loader(train)))
        order = batch["idx"].tolist()
        assert sorted(order) == list(range(16)) and order != list(range(16))
        (eval_batch,) = list(engine.build_data_loader(valid))
        assert eval_batch["idx"].tolist() == list(range(16))
        want = tok.pad([{k: rows[k][i] for k in ("input_ids", "attention_mask",
                        "token_type_ids")} for i in range(16)], return_tensors="pt")  # fmt: skip
        for key, value in want.items():
            assert torch.equal(eval_batch[key], value), key
        assert eval_batch["labels"].tolist() == rows["label"] and "label" not in eval_batch
        assert (engine.tokenizer is not None) == with_tokenizer


def test_rapidformer_names_and_megatron_args(in_here, tmp_path):
    """RapidformerEngine(extra_args_provider) adds the script's flags; Megatron's names map
    onto ours; the names are importable as rapidformer / megatron.mpu only in a --user-script."""

    def extra(parser):
        parser.add_argument_group("mine").add_argument("--my-flag", type=int, default=0)
        return parser

    dist.setup_dist_util({})
    words = ["--my-flag", "3", "--mask-prob", "0.2", "--dataset-path", "glue", "--dataset-name",
             "mrpc", "--mmap-warmup", "--save", str(tmp_path)]  # fmt: skip
    engine = RapidformerEngine(extra_args_provider=extra, args=words)
    args = get_args()
    assert args is engine.args and args.my_flag == 3
    assert args.mask_prob == args.mlm_probability == 0.2
    assert (args.dataset_path, args.data_path, args.dataset_name) == ("glue", "glue", "mrpc")
    assert args.mmap_warmup and args.short_seq_prob == 0.1 and args.local_rank == 0
    assert (args.data_impl, args.split) == ("mmap", "980,20")
    timers, start = get_timers(), time.perf_counter()
    timers("step").start()
    time.sleep(0.02)
    timers("step").stop()
    outer = time.perf_counter() - start
    assert 0.02 <= timers("step").elapsed(reset=False) <= outer
    assert timers.log(["step"]).startswith("time (ms) | step: ")
    not_importable()
    script = tmp_path / "probe.py"
    script.write_text(
        "import rapidformer, megatron.mpu\nfrom megatron import mpu\n"
        "SEEN = (rapidformer.Pretrainer is rapidformer.PreTrainer, mpu is megatron.mpu)\n"
        "NAMES = (rapidformer.__name__, megatron.__name__)\n"
    )
    namespace = run_user_script(str(script), ["--save", str(tmp_path)])
    assert namespace["SEEN"] == (True, True)
    # each module's __name__ is the name it is imported by, as the import system sets it
    assert namespace["NAMES"] == ("rapidformer", "megatron")
    not_importable()
    with pytest.raises(ModuleNotFoundError):
        import rapidformer  # noqa: F401


def test_broadcast_data_sends_tp_rank0s_batch():
    """mpu.broadcast_data on tp=2 (gloo): rank 1 passes None and gets rank 0's tensors, all
    int64 (rank 0's float tensor cast, as the datatype says)."""
    results = torchrun("accelerate_broadcast.py", 2)
    for r in results:
        assert r["ok"], f"{r['error']}\n{r['trace']}"
    g = torch.Generator().manual_seed(7)
    want = {
        "input_ids": torch.randint(0, 100, (3, 5), generator=g).tolist(),
        "next_sentence_label": [1, 0, 1],
        "weights": [[1, 2], [3, 4]],
    }
    assert sorted(r["tp_rank"] for r in results) == [0, 1]
    for r in results:
        assert r["values"] == want and r["dtypes"] == ["torch.int64"]
        assert r["long_shape"] == [2**24 + 3] and r["long_equal"]
