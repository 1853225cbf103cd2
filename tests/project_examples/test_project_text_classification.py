"""projects/text_classification: BERT fine-tuned through tools/train_net.py on local CSVs.

A tiny BERT learns the shipped sample (1 process) and a sentence-pair CSV under tensor
parallelism (2 processes); accuracy is evaluated, labels.json names the classes, and
predict.py gives the labels back (its accuracy is the evaluator's). The Hugging Face config
starts from a tiny saved BERT; bad data gives errors that name the file, column and key.
"""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pytest
import torch
from launch import free_port
from train_net_helpers import ROOT, read_metrics, run_train_net, train_env

from libai import dist
from libai.config import LazyConfig, instantiate

PROJECT = ROOT / "projects" / "text_classification"
CONFIG = PROJECT / "configs" / "config.py"
CONFIG_HF = PROJECT / "configs" / "config_hf.py"
SAMPLE = PROJECT / "sample_data"
LABELS = ["negative", "neutral", "positive"]
TINY = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=2",
    "model.cfg.intermediate_size=64",
    "model.cfg.max_position_embeddings=64",
    "model.cfg.hidden_dropout_prob=0.0",
    "model.cfg.attention_probs_dropout_prob=0.0",
    "train.train_epoch=0",
    "train.train_micro_batch_size=32",
    "train.log_period=1",
    "optim.lr=5e-3",
    "train.checkpointer.period=1000",  # model_final (and model_best) only
]


def losses(metrics: dict, iters: int) -> list[float]:
    return [metrics[i]["total_loss"] for i in range(iters)]


def assert_learns(values: list[float], margin: float) -> None:
    """The mean of the last 5 losses is ``margin`` below the mean of the first 5."""
    assert sum(values[-5:]) / 5 < sum(values[:5]) / 5 - margin, values


def read_csv(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def predict(out_dir, *args) -> list[dict]:
    """predict.py on 1 process, as a user runs it; its JSON lines."""
    cmd = [sys.executable, str(PROJECT / "predict.py"), str(out_dir), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=train_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


# ---- the shipped sample, 1 process ---------------------------------------------------------
def test_sample_data_is_what_the_script_writes(tmp_path):
    sys.path.insert(0, str(PROJECT))
    try:
        from prepare_sample_data import prepare_sample_data
    finally:
        sys.path.remove(str(PROJECT))
    for name, path in prepare_sample_data(str(tmp_path)).items():
        assert (SAMPLE / name).read_bytes() == open(path, "rb").read(), name
    rows = read_csv(SAMPLE / "train.csv")
    assert len(rows) == 300 and sorted({r["label"] for r in rows}) == LABELS


def test_fine_tune_evaluate_and_predict_on_the_sample(tmp_path):
    out = tmp_path / "run"
    opts = [*TINY, f"train.output_dir={out}", "train.train_iter=100"]
    run_train_net(CONFIG, [*opts, "train.evaluation.eval_period=50"])
    metrics = read_metrics(out)
    assert_learns(losses(metrics, 100), 0.8)  # ln 3 = 1.10 -> near 0
    assert [i for i in metrics if "Acc@1" in metrics[i]] == [49, 99]
    accuracy = metrics[99]["Acc@1"]
    assert accuracy >= 95.0, metrics[99]
    labels = json.loads((out / "labels.json").read_text())
    assert labels["labels"] == LABELS and labels["text_columns"] == ["sentence"]
    assert (out / "model_final" / ".metadata").is_file() and (out / "model_best").is_dir()

    # predict.py on the validation set and two new sentences, every label ranked
    valid = read_csv(SAMPLE / "valid.csv")
    new = ["The soundtrack is truly superb.", "The ending felt tedious to me."]
    answers = predict(out, *(r["sentence"] for r in valid), *new, "--top-k", "3")
    assert [a["text"] for a in answers] == [r["sentence"] for r in valid] + new
    for answer in answers:
        ranked = answer["labels"]
        assert sorted(x["label"] for x in ranked) == LABELS
        assert sum(x["score"] for x in ranked) == pytest.approx(1.0, abs=1e-5)
        assert ranked[0]["score"] >= ranked[1]["score"] >= ranked[2]["score"]
    best = [a["labels"][0]["label"] for a in answers]
    hits = sum(b == r["label"] for b, r in zip(best, valid))
    assert 100.0 * hits / len(valid) == pytest.approx(accuracy)  # the evaluator's accuracy
    assert best[-2:] == ["positive", "negative"]


# ---- sentence pairs, tensor parallel 2 -----------------------------------------------------
@pytest.fixture(scope="module")
def pair_data(tmp_path_factory):
    """Pairs whose label (an id, 0-2) is the first sentence's sentiment, and a vocab of the
    sample's plus filler tokens: 300 entries, padded to 384 on 1 process, 512 under tp2."""
    sys.path.insert(0, str(PROJECT))
    try:
        from prepare_sample_data import review
    finally:
        sys.path.remove(str(PROJECT))
    root = tmp_path_factory.mktemp("pairs")
    rng = random.Random(1)

    def rows(n):
        out = []
        for _ in range(n):
            label = rng.randrange(3)
            out.append((review(rng, LABELS[label]), review(rng, rng.choice(LABELS)), label))
        return out

    header = ["premise", "hypothesis", "verdict"]
    vocab = (SAMPLE / "vocab.txt").read_text().split()
    (root / "vocab.txt").write_text(
        "\n".join(vocab + [f"filler{i}" for i in range(300 - len(vocab))]) + "\n"
    )
    return {
        "train": write_csv(root / "train.csv", header, rows(160)),
        "valid": write_csv(root / "valid.csv", header, rows(32)),
        "vocab": root / "vocab.txt",
    }


def test_sentence_pairs_under_tensor_parallel(pair_data, tmp_path):
    out = tmp_path / "pairs"
    opts = [
        *TINY,
        f"train.output_dir={out}",
        f"tokenization.tokenizer.vocab_file={pair_data['vocab']}",
        f"dataloader.train.dataset.0.data_path={pair_data['train']}",
        f"dataloader.train.valid_dataset.data_path={pair_data['valid']}",
        "dataloader.train.dataset.0.text_columns=[premise,hypothesis]",
        "dataloader.train.dataset.0.label_column=verdict",
        "dataloader.train.dataset.0.max_seq_length=40",
        "train.train_iter=100",
        "train.evaluation.eval_period=100",
        "train.dist.tensor_parallel_size=2",
    ]
    # the project's launcher (tools/train.sh on 2 processes)
    env = {**train_env(), "PORT": str(free_port())}
    cmd = ["bash", str(PROJECT / "train.sh"), "2", *opts]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = read_metrics(out)
    assert_learns(losses(metrics, 100), 0.8)
    accuracy = metrics[99]["Acc@1"]
    assert accuracy >= 90.0, metrics[99]
    labels = json.loads((out / "labels.json").read_text())
    assert labels["labels"] == ["0", "1", "2"]  # class ids name themselves
    assert labels["text_columns"] == ["premise", "hypothesis"]
    saved = LazyConfig.load(str(out / "config.yaml"))
    assert saved.train.dist.tensor_parallel_size == 2
    assert saved.model.cfg.vocab_size == 384  # as built (tokenization.setup), not BERT's 30522

    # the tp2 checkpoint on 1 process: the padded vocab (a multiple of 128) is the same on
    # every layout, so it loads as it is; pairs in, ids out
    from projects.text_classification.predict import LabeledTextClassifier

    classifier = LabeledTextClassifier(out)
    assert classifier.pair and classifier.model.libai_cfg["vocab_size"] == 384
    valid = read_csv(pair_data["valid"])
    answers = classifier([(r["premise"], r["hypothesis"]) for r in valid])
    hits = sum(a["label"] == r["verdict"] for a, r in zip(answers, valid))
    assert 100.0 * hits / len(valid) == pytest.approx(accuracy)
    single = classifier((valid[0]["premise"], valid[0]["hypothesis"]))  # one pair
    assert single == [answers[0]]
    with pytest.raises(ValueError, match="classifies sentence pairs"):
        classifier(["just one sentence"])


# ---- starting from Hugging Face weights --------------------------------------------------
@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    """A tiny random ``BertForPreTraining`` saved with the sample's vocab.txt."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("hf") / "bert"
    vocab = (SAMPLE / "vocab.txt").read_text()
    config = transformers.BertConfig(
        vocab_size=len(vocab.split()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(config)
    hf.save_pretrained(path)
    (path / "vocab.txt").write_text(vocab)
    return path, hf.state_dict()


def test_config_hf_loads_the_checkpoint_and_fine_tunes(hf_bert, tmp_path):
    path, state = hf_bert
    cfg = LazyConfig.apply_overrides(LazyConfig.load(str(CONFIG_HF)), [f"model.path={path}"])
    dist.setup_dist_util({})
    model = instantiate(cfg.model)
    assert model.num_labels == 3 and model.classifier.weight.shape == (3, 32)
    bert = dict(model.bert.named_parameters())
    assert torch.equal(
        bert["embeddings.vocab_embeddings.weight"], state["bert.embeddings.word_embeddings.weight"]
    )
    assert torch.equal(
        bert["encoders.1.mlp.dense_4h_to_h.weight"],
        state["bert.encoder.layer.1.output.dense.weight"],
    )
    # through tools/train_net.py: the tokenizer is model.path's vocab.txt
    out = tmp_path / "hf_run"
    opts = [
        f"model.path={path}",
        f"train.output_dir={out}",
        "dataloader.train.dataset.0.max_seq_length=32",
        "train.train_epoch=0",
        "train.train_iter=60",
        "train.train_micro_batch_size=32",
        "train.log_period=1",
        "train.evaluation.eval_period=60",
        "optim.lr=5e-3",
    ]
    proc = run_train_net(CONFIG_HF, opts)
    assert (
        "newly initialized: ['classifier.weight', 'classifier.bias']" in proc.stdout + proc.stderr
    )
    metrics = read_metrics(out)
    assert_learns(losses(metrics, 60), 0.2)
    assert metrics[59]["Acc@1"] >= 90.0


# ---- bad input -----------------------------------------------------------------------------
def datasets(*overrides):
    """The train and valid datasets of the project config with ``overrides``."""
    cfg = LazyConfig.apply_overrides(LazyConfig.load(str(CONFIG)), list(overrides))
    return instantiate(cfg.dataloader.train.dataset[0]), instantiate(
        cfg.dataloader.train.valid_dataset
    )


def test_missing_files(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match=f"data file not found: {missing}"):
        datasets(f"dataloader.train.dataset.0.data_path={missing}")
    with pytest.raises(FileNotFoundError, match=f"data file not found: {missing}"):
        datasets(f"dataloader.train.valid_dataset.data_path={missing}")
    with pytest.raises(FileNotFoundError, match=r"labels.json not found: .*training output"):
        from projects.text_classification.predict import main

        main([str(tmp_path), "some text"])


def test_label_errors_name_the_file_column_and_key(tmp_path):
    with pytest.raises(ValueError, match=r"train.csv, row 1 \(line 2\): no column 'gold'; the "):
        datasets("dataloader.train.dataset.0.label_column=gold")
    with pytest.raises(ValueError, match=r"no column 'text'; the columns found are \['label', 's"):
        datasets("dataloader.train.dataset.0.text_columns=[text]")
    with pytest.raises(
        ValueError,
        match=r"train.csv, column 'label': 3 labels \['negative', 'neutral', 'positive'\], but "
        r"num_labels is 2; set model.cfg.num_labels=3",
    ):
        datasets("model.cfg.num_labels=2")
    extra = write_csv(
        tmp_path / "dev.csv", ["sentence", "label"], [["fine", "positive"], ["x", "angry"]]
    )
    with pytest.raises(
        ValueError, match=r"dev.csv, row 2 \(line 3\), column 'label': label 'angry' is not in"
    ):
        datasets(f"dataloader.train.valid_dataset.data_path={extra}")
    # a validation file without every class keeps the training file's ids
    only = write_csv(tmp_path / "pos.csv", ["sentence", "label"], [["fine", "positive"]])
    train, valid = datasets(f"dataloader.train.valid_dataset.data_path={only}")
    assert train.label_names == valid.label_names == LABELS and valid.labels == [2]
    # labels listed in the config number the classes (and are checked against num_labels)
    train, valid = datasets("dataloader.train.dataset.0.labels=[positive,negative,neutral]")
    assert valid.label_names == ["positive", "negative", "neutral"]
    assert train.labels[0] == ["positive", "negative", "neutral"].index(train_labels()[0])
    with pytest.raises(
        ValueError,
        match=r"the labels given in the config: 2 labels \[.positive., .negative.\], but num_labels is 3",
    ):
        datasets("dataloader.train.dataset.0.labels=[positive,negative]")


def train_labels() -> list[str]:
    return [r["label"] for r in read_csv(SAMPLE / "train.csv")]
