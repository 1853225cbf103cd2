"""projects/simcse: the contrastive loss against a plain-torch reference, Spearman with ties,
the datasets and their errors, a Hugging Face start and export, tiny BERTs trained through
tools/train_net.py on 1 process and on dp2 x tp2 (equal losses and Spearman at dropout 0),
and pipeline parallelism refused.

Everything is built here, offline: a one-token-per-word WordPiece vocabulary, a text corpus,
NLI triples and STS pairs whose gold score falls with the number of words changed.
"""

from __future__ import annotations

import csv
import math
import random
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from launch import free_port
from train_net_helpers import ROOT, read_metrics, run_train_net, train_env

from libai import dist
from libai.config import LazyConfig
from libai.tokenizer import BertTokenizer
from projects.simcse.dataset import STSDataset, SupervisedDataset, UnsupervisedDataset
from projects.simcse.evaluator import SpearmanEvaluator, average_ranks, spearman
from projects.simcse.loss import contrastive_loss
from projects.simcse.modeling import SimCSE

CONFIGS = ROOT / "projects" / "simcse" / "configs"
WORDS = (
    "the quick brown fox jumps over a lazy dog while model training reads language data "
    "from many documents and every sentence ends here attention layers learn to predict"
).split()
TINY_BERT = dict(
    vocab_size=128,
    hidden_size=32,
    hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
)
SEQ = 16


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."


def _edit(rng: random.Random, sentence: str, changes: int) -> str:
    """``sentence`` with ``changes`` words replaced by different ones."""
    words = sentence.split()
    for i in rng.sample(range(len(words)), min(changes, len(words))):
        words[i] = rng.choice([w for w in WORDS if w != words[i]])
    return " ".join(words)


def _write_csv(path, header, rows) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("simcse_data")
    rng = random.Random(0)
    sentences = [_sentence(rng) for _ in range(200)]
    # a WordPiece vocabulary with one token per word, written in a fixed order (the
    # `tokenizers` trainer orders equal-count pieces differently from run to run)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(WORDS))]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (root / "corpus.txt").write_text("\n".join(sentences[:128]) + "\n\n", encoding="utf-8")
    sts = []
    for sentence in sentences[150:174]:  # no identical pairs: no float-tied predictions
        changes = rng.randint(1, 5)
        sts.append([sentence, _edit(rng, sentence, changes), 5 - changes + 0.5 * rng.random()])
    nli = [[s, _edit(rng, s, 1), rng.choice(sentences)] for s in sentences[:64]]
    return {
        "root": root,
        "vocab": str(root / "vocab.txt"),
        "corpus": str(root / "corpus.txt"),
        "sts": _write_csv(root / "sts.csv", ["sentence1", "sentence2", "score"], sts),
        "nli": _write_csv(root / "nli.csv", ["sent0", "sent1", "hard_neg"], nli),
    }


@pytest.fixture(scope="module")
def tokenizer(data):
    return BertTokenizer(vocab_file=data["vocab"])


def tiny_model(**options) -> SimCSE:
    dist.setup_dist_util({})
    torch.manual_seed(0)
    return SimCSE(cfg={**TINY_BERT, **options})


# ---- the loss ---------------------------------------------------------------------------------
def reference_loss(emb: torch.Tensor, temperature: float, weight: float = 0.0) -> torch.Tensor:
    """SimCSE's loss written out row by row in float64: anchor ``i`` scored against every
    positive ``j`` and (n = 3) every hard negative ``j``, plus ``weight`` on its own."""
    emb = emb.double()
    total = 0.0
    for i in range(emb.shape[0]):
        scores = [F.cosine_similarity(emb[i, 0], emb[j, 1], dim=0) for j in range(len(emb))]
        if emb.shape[1] == 3:
            scores += [
                F.cosine_similarity(emb[i, 0], emb[j, 2], dim=0) + weight * temperature * (i == j)
                for j in range(len(emb))
            ]
        logits = torch.stack(scores) / temperature
        total = total + torch.logsumexp(logits, 0) - logits[i]
    return total / emb.shape[0]


@pytest.mark.parametrize("n, weight", [(2, 0.0), (3, 0.0), (3, 0.7)])
def test_contrastive_loss_equals_reference(n, weight):
    emb = torch.randn(6, n, 8, generator=torch.Generator().manual_seed(n)).requires_grad_()
    loss = contrastive_loss(emb, temperature=0.05, hard_negative_weight=weight)
    (grad,) = torch.autograd.grad(loss, emb)
    ref_emb = emb.detach().double().requires_grad_()
    ref = reference_loss(ref_emb, 0.05, weight)
    (ref_grad,) = torch.autograd.grad(ref, ref_emb)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-6)
    # the hard negatives and their weight change the value: they are really in the logits
    if n == 3:
        assert loss.item() != pytest.approx(contrastive_loss(emb[:, :2]).item(), rel=1e-3)


def test_model_losses_are_the_reference_on_its_embeddings(data, tokenizer):
    model = tiny_model(hard_negative_weight=0.3).train()
    unsup = UnsupervisedDataset(data["corpus"], tokenizer, SEQ)
    sup = SupervisedDataset(data["nli"], tokenizer, SEQ)
    for dataset in (unsup, sup):
        batch = {k: torch.stack([dataset[i][k] for i in range(8)]) for k in dataset[0]}
        torch.manual_seed(1)
        loss = model(**batch)["loss"]
        torch.manual_seed(1)  # the same dropout masks
        emb = model.pipeline_forward(batch["input_ids"], batch["attention_mask"]).detach()
        assert emb.shape == (8, 2 if dataset is unsup else 3, 32)
        assert loss.item() == pytest.approx(reference_loss(emb, 0.05, 0.3).item(), rel=1e-5)
    # unsupervised: one sentence, two dropout views that differ
    views = model.pipeline_forward(batch["input_ids"][:, 0], batch["attention_mask"][:, 0])
    assert not torch.allclose(views[:, 0], views[:, 1])
    # eval: no dropout, no MLP (mlp="train_only"): the [CLS] state itself
    model.eval()
    with torch.no_grad():
        out = model(**{k: v[:, :2] for k, v in batch.items()})
        cls = model.bert(batch["input_ids"][:, 0], batch["attention_mask"][:, 0])
    torch.testing.assert_close(out["embeddings"][:, 0], cls["last_hidden_state"][:, 0])
    torch.testing.assert_close(
        out["cos_sim"], F.cosine_similarity(out["embeddings"][:, 0], out["embeddings"][:, 1])
    )


# ---- Spearman ---------------------------------------------------------------------------------
def test_spearman_with_ties_by_hand():
    np.testing.assert_array_equal(average_ranks([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
    np.testing.assert_array_equal(average_ranks([3, 1, 3, 3]), [3, 1, 3, 3])
    # ranks x = 1, 2.5, 2.5, 4 and y = 1, 3, 2, 4: cov 4.5, var 4.5 and 5 -> 3 / sqrt(10)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))
    assert spearman([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1], [2]))
    # without ties: the textbook formula 1 - 6 sum d^2 / (n (n^2 - 1))
    rng = np.random.default_rng(0)
    x, y = rng.permutation(30), rng.permutation(30)
    d = (np.argsort(np.argsort(x)) - np.argsort(np.argsort(y))).astype(float)
    assert spearman(x, y) == pytest.approx(1 - 6 * (d**2).sum() / (30 * (30**2 - 1)))


def test_evaluator_reads_cosines_or_embeddings():
    dist.setup_dist_util({})
    emb = torch.randn(10, 2, 4, generator=torch.Generator().manual_seed(0))
    gold = torch.tensor([0.0, 1, 1, 2, 3, 3, 3, 4, 5, 5])
    cos = F.cosine_similarity(emb[:, 0], emb[:, 1], dim=-1)
    results = []
    for outputs in ({"cos_sim": cos}, {"logits": emb}):
        evaluator = SpearmanEvaluator()
        evaluator.process({"labels": gold[:6]}, {k: v[:6] for k, v in outputs.items()})
        evaluator.process({"labels": gold[6:]}, {k: v[6:] for k, v in outputs.items()})
        results.append(evaluator.evaluate()["spearman"])
    assert results[0] == pytest.approx(results[1]) == pytest.approx(spearman(cos, gold))
    with pytest.raises(KeyError, match="inputs\\['labels'\\]"):
        SpearmanEvaluator().process({}, {"cos_sim": cos})
    with pytest.raises(ValueError, match="\\[batch, 2, hidden\\]"):
        SpearmanEvaluator().process({"labels": gold}, {"embeddings": emb[:, 0]})


def test_inference_on_dataset_reports_spearman(data, tokenizer):
    from libai.data import build_nlp_test_loader
    from libai.evaluation import inference_on_dataset

    model = tiny_model(pooling="mean")
    sts = STSDataset(data["sts"], tokenizer, SEQ)
    results = inference_on_dataset(model, build_nlp_test_loader(sts, 5), SpearmanEvaluator())
    assert model.training  # inference_on_dataset restores the mode
    with torch.no_grad():
        emb = model.eval().encode(
            torch.stack([s["input_ids"] for s in sts]),
            torch.stack([s["attention_mask"] for s in sts]),
        )
    cos = F.cosine_similarity(emb[:, 0], emb[:, 1], dim=-1)
    assert results["spearman"] == pytest.approx(spearman(cos, sts.scores))


# ---- data -------------------------------------------------------------------------------------
def test_datasets_encode_each_sentence(data, tokenizer):
    unsup = UnsupervisedDataset(data["corpus"], tokenizer, SEQ)
    assert len(unsup) == 128  # the blank lines are skipped
    sample = unsup[0]
    ids = tokenizer.encode(unsup.sentences[0], add_special_tokens=True)
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    n = min(len(ids), SEQ)
    expected = ids[: n - 1] + [tokenizer.sep_token_id] if len(ids) > SEQ else ids
    assert sample["input_ids"][:n].tolist() == expected
    assert sample["input_ids"][n:].eq(tokenizer.pad_token_id).all()
    assert sample["attention_mask"].tolist() == [1] * n + [0] * (SEQ - n)
    long = UnsupervisedDataset(data["corpus"], tokenizer, 6)  # cut, ending with [SEP]
    assert long[0]["input_ids"].tolist() == ids[:5] + [tokenizer.sep_token_id]
    sup = SupervisedDataset(data["nli"], tokenizer, SEQ)
    assert len(sup) == 64 and sup[0]["input_ids"].shape == (3, SEQ)
    sts = STSDataset(data["sts"], tokenizer, SEQ)
    assert sts[0]["input_ids"].shape == (2, SEQ) and sts[0]["labels"].dtype == torch.float32
    # GLUE's STS-B dev.tsv layout: more columns, tab-separated, an unbalanced quote
    tsv = data["root"] / "sts-b.tsv"
    tsv.write_text(
        'index\tgenre\tsentence1\tsentence2\tscore\n0\tnews\tthe "quick fox.\ta lazy dog.\t3.25\n'
    )
    glue = STSDataset(tsv, tokenizer, SEQ)
    assert glue.pairs == [('the "quick fox.', "a lazy dog.")] and glue.scores == [3.25]


def test_bad_input_fails_clearly(data, tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="dataloader.train.dataset.0.data_path"):
        UnsupervisedDataset(tmp_path / "missing.txt", tokenizer)
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="holds no sentences"):
        UnsupervisedDataset(tmp_path / "empty.txt", tokenizer)
    bad = _write_csv(tmp_path / "nli.csv", ["premise", "sent1", "hard_neg"], [["a", "b", "c"]])
    with pytest.raises(ValueError, match="no column 'sent0'.*premise"):
        SupervisedDataset(bad, tokenizer)
    bad = _write_csv(tmp_path / "sts.csv", ["sentence1", "sentence2", "score"], [["a", "b", "x"]])
    with pytest.raises(ValueError, match="data row 1: score 'x'"):
        STSDataset(bad, tokenizer)
    bad = _write_csv(tmp_path / "sts2.csv", ["sentence1", "sentence2", "score"], [["a", "", "1"]])
    with pytest.raises(ValueError, match="line 2: column 'sentence2' is empty"):
        STSDataset(bad, tokenizer)
    with pytest.raises(ValueError, match="exceed the 2 special tokens"):
        UnsupervisedDataset(data["corpus"], tokenizer, max_seq_length=2)
    with pytest.raises(ValueError, match="model.cfg.pooling"):
        tiny_model(pooling="max")
    with pytest.raises(ValueError, match="model.cfg.temperature"):
        tiny_model(temperature=0)
    with pytest.raises(ValueError, match="unknown config key model.cfg.temprature"):
        tiny_model(temprature=0.1)
    with pytest.raises(ValueError, match="\\[batch, 2 or 3, hidden\\]"):
        contrastive_loss(torch.randn(4, 4, 8))


# ---- Hugging Face -----------------------------------------------------------------------------
def test_starts_from_a_hugging_face_bert(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    hf = transformers.BertForPreTraining(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    # config.json decides the shapes (hidden_layers=7 is replaced by its 2)
    model = tiny_model(pretrained_model_path=str(tmp_path / "hf"), hidden_layers=7).eval()
    assert model.bert.libai_cfg["hidden_layers"] == 2
    ids = torch.randint(5, 120, (3, 2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 1, 6:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
        ref = hf.bert(input_ids=ids.view(6, 10), attention_mask=mask.view(6, 10))
    torch.testing.assert_close(
        out["embeddings"], ref.last_hidden_state[:, 0].view(3, 2, -1), rtol=1e-4, atol=1e-5
    )
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'bert'"):
        tiny_model(pretrained_model_path=str(tmp_path / "gpt2"))


# ---- training through tools/train_net.py ------------------------------------------------------
def tiny_opts(data, out_dir, train_file, iters=8) -> list[str]:
    return [
        *(f"model.cfg.{k}={v}" for k, v in TINY_BERT.items() if k != "vocab_size"),
        f"tokenization.tokenizer.vocab_file={data['vocab']}",
        f"dataloader.train.dataset.0.data_path={train_file}",
        f"dataloader.train.dataset.0.max_seq_length={SEQ}",
        f"dataloader.train.valid_dataset.data_path={data['sts']}",
        "dataloader.train.num_workers=0",
        "train.train_micro_batch_size=16",
        "train.test_micro_batch_size=8",
        "train.train_epoch=0",
        f"train.train_iter={iters}",
        f"train.evaluation.eval_period={iters}",
        "train.log_period=1",
        "optim.lr=1e-3",
        f"train.output_dir={out_dir}",
        # a random tiny BERT gives nearly the same [CLS] state to every sentence, and learns
        # to tell them apart slowly; the mean over the tokens separates them in a few steps
        "model.cfg.pooling=mean",
    ]


def losses_of(out_dir, iters: int) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in range(iters)]


def test_unsupervised_trains_evaluates_and_exports(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    from projects.simcse import export_hf

    out = tmp_path / "unsup"
    opts = tiny_opts(data, out, data["corpus"], iters=12)
    run_train_net(CONFIGS / "simcse_unsup.py", opts)
    losses = losses_of(out, 12)
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses
    spearman_value = read_metrics(out)[11]["spearman"]
    assert -1 <= spearman_value <= 1
    assert (out / "model_final" / ".metadata").exists() and (out / "model_best").exists()
    cfg = LazyConfig.load(str(out / "config.yaml"))  # the saved config loads back
    assert cfg.model._target_ == "projects.simcse.modeling.SimCSE"
    assert cfg.model.cfg.pooling == "mean" and cfg.train.evaluation.eval_metric == "spearman"
    # the exported encoder (no pooler: the MLP was for training only) reproduces the run's
    # final evaluation in transformers: mean-pooled embeddings, the same Spearman
    export_hf.main(
        ["--config-file", str(out / "config.yaml"), "--checkpoint", str(out / "model_final")]
        + ["--output", str(tmp_path / "hf")]
    )
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "pooler" in k]
    hf = transformers.BertModel.from_pretrained(tmp_path / "hf", add_pooling_layer=False).eval()
    sts = STSDataset(data["sts"], BertTokenizer(vocab_file=str(tmp_path / "hf" / "vocab.txt")), SEQ)
    ids = torch.stack([sts[i]["input_ids"] for i in range(len(sts))]).view(-1, SEQ)
    mask = torch.stack([sts[i]["attention_mask"] for i in range(len(sts))]).view(-1, SEQ)
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    emb = ((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).view(len(sts), 2, -1)
    cos = F.cosine_similarity(emb[:, 0], emb[:, 1], dim=-1)
    assert spearman(cos, sts.scores) == pytest.approx(spearman_value, abs=1e-6)


def test_supervised_trains(data, tmp_path):
    out = tmp_path / "sup"
    opts = tiny_opts(data, out, data["nli"]) + ["model.cfg.hard_negative_weight=0.5"]
    run_train_net(CONFIGS / "simcse_sup.py", opts)
    losses = losses_of(out, 8)
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses
    assert -1 <= read_metrics(out)[7]["spearman"] <= 1


def test_data_x_tensor_parallel_equals_one_process(data, tmp_path):
    """At dropout 0 the runs are deterministic: on dp2 x tp2 (4 processes, launched by the
    project's train.sh) the candidates are gathered over the data-parallel ranks and the STS
    pairs by the evaluator, so the losses and the Spearman are those of one process on the
    same global batch of 16, step by step."""
    no_dropout = ["model.cfg.hidden_dropout_prob=0.0", "model.cfg.attention_probs_dropout_prob=0.0"]
    single, parallel = tmp_path / "single", tmp_path / "dp2_tp2"
    run_train_net(
        CONFIGS / "simcse_unsup.py", tiny_opts(data, single, data["corpus"], iters=6) + no_dropout
    )
    opts = tiny_opts(data, parallel, data["corpus"], iters=6) + no_dropout
    opts += ["train.train_micro_batch_size=8", "train.dist.tensor_parallel_size=2"]
    env = {**train_env(), "PORT": str(free_port())}
    cmd = ["bash", str(ROOT / "projects" / "simcse" / "train.sh"), "unsup", "4", *opts]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = losses_of(single, 6)
    assert losses[-1] < losses[0] - 0.5, losses
    np.testing.assert_allclose(losses_of(parallel, 6), losses, rtol=1e-5)
    expected = read_metrics(single)[5]["spearman"]
    assert read_metrics(parallel)[5]["spearman"] == pytest.approx(expected, abs=1e-6)


def test_pipeline_parallel_is_refused_with_the_reason(monkeypatch):
    # raised while the model is built, on every rank and before any collective; checked here
    # on a mesh that reports two stages (a real pp2 launch costs ~7 s of the suite's budget)
    import projects.simcse.modeling as modeling

    monkeypatch.setattr(modeling.dist, "get_pipeline_parallel_size", lambda: 2)
    with pytest.raises(ValueError, match="does not run with train.dist.pipeline_parallel_size > 1"):
        tiny_model()
