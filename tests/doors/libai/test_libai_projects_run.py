"""LiBai's own projects text_classification and QQP (tests/fixtures/libai/projects, byte for
byte from LiBai 9dcbe3b2: OneFlow code on top of LiBai's layers) train and evaluate through
tools/train_net.py, run as LiBai's users run them: from the checkout's root, with
overrides only for sizes, run length and data paths (plus dropout 0, ``graph.enabled=False``
and ``train.amp.enabled=False`` as in the other LiBai-config tests). Their ``import oneflow``
gets OneFlow's API mapped onto torch (``libai.oneflow_api``).

- the first loss equals an independent computation: libai's ``BertModel`` and a torch
  ``Linear`` holding the run's weights, ``F.cross_entropy``, on the data tokenized here with
  our ``BertTokenizer`` (the project's dataset, tokenizer and OneFlow code not involved);
- dp2 and tp2 equal one process (every iteration's loss, fp32), and on tp2 each rank holds
  half of the row-parallel classifier (the checkpoint's shards);
- the accuracy the run reports equals the reference model's on the dev set.

One override is not a size or a path: text_classification's ``train.update(dict(evaluation=
dict(enabled=True, eval_period=500)))`` replaces ``common/train.py``'s whole evaluation node,
its evaluator included (OmegaConf assigns, it does not merge: LiBai's run of this file stops
at its first evaluation the same way), so the tests give the evaluator back.
"""

from __future__ import annotations

import inspect
import json
import random
import re

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from train_net_helpers import ROOT, read_metrics, run_train_net

from libai.checkpoint.checkpointer import read_checkpoint_metadata
from libai.config import LazyConfig
from libai.models import BertModel
from libai.tokenizer import BertTokenizer

LIBAI_CHECKOUT = ROOT / "tests" / "fixtures" / "libai"
TEXT_CLS = "projects/text_classification/configs/config.py"
QQP = "projects/QQP/configs/config_qqp.py"
SIMCSE = "projects/SimCSE/config/config_simcse_sup.py"
WORDS = "the quick brown fox jumps over a lazy dog while model training reads data".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "中", "国", "人"]
SEQ = 32
TINY = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=2",
    "model.cfg.intermediate_size=64",
    f"model.cfg.max_position_embeddings={SEQ}",
    "model.cfg.hidden_dropout_prob=0.0",
    "model.cfg.attention_probs_dropout_prob=0.0",
    "train.log_period=1",
    "graph.enabled=False",
    "train.amp.enabled=False",
]


def _pairs(rng: random.Random, n: int, second_words: list[str]) -> list[tuple[str, str, int]]:
    return [
        (
            " ".join(rng.choices(WORDS, k=rng.randint(3, 9))),
            " ".join(rng.choices(second_words, k=rng.randint(3, 9))),
            rng.randint(0, 1),
        )
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A vocab, and 32 training and 8 dev sentence pairs for each project: CLUE's afqmc JSON
    lines (with Chinese characters), GLUE's QQP TSV (English: QQP's tokenizer gives a Chinese
    character inside a jieba word an id of its own, id + vocab size, which the reference
    would have to copy)."""
    root = tmp_path_factory.mktemp("libai_projects")
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    rng = random.Random(0)
    chinese = WORDS + ["中", "国", "人"]
    splits = {TEXT_CLS: {s: _pairs(rng, n, chinese) for s, n in (("train", 32), ("dev", 8))}}
    splits[QQP] = {s: _pairs(rng, n, WORDS) for s, n in (("train", 32), ("dev", 8))}
    (root / "afqmc").mkdir()
    for split, pairs in splits[TEXT_CLS].items():
        with open(root / "afqmc" / f"{split}.json", "w", encoding="utf-8") as f:
            for a, b, label in pairs:
                line = {"sentence1": a, "sentence2": b, "label": str(label)}
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
    for split, pairs in splits[QQP].items():
        with open(root / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
            for i, (a, b, label) in enumerate(pairs):
                f.write(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{label}\n")
    # SimCSE: SNLI triples (jsonlines) to train, CNSD-STS pairs scored 0-5 to evaluate
    words = lambda: " ".join(rng.choices(chinese, k=rng.randint(3, 9)))  # noqa: E731
    splits[SIMCSE] = {"train": [(words(), words(), words()) for _ in range(16)]}
    with open(root / "snli.jsonl", "w", encoding="utf-8") as f:
        for origin, entailment, contradiction in splits[SIMCSE]["train"]:
            line = {"origin": origin, "entailment": entailment, "contradiction": contradiction}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    for split in ("test", "dev"):
        splits[SIMCSE][split] = [(words(), words(), rng.randint(0, 5)) for _ in range(8)]
        with open(root / f"sts-{split}.txt", "w", encoding="utf-8") as f:
            for i, (a, b, score) in enumerate(splits[SIMCSE][split]):
                f.write(f"{i}||{a}||{b}||{score}\n")
    return {"root": root, "pairs": splits}


def data_overrides(project: str, data) -> list[str]:
    root, vocab = data["root"], data["root"] / "vocab.txt"
    if project == TEXT_CLS:
        return [
            f"tokenization.tokenizer.vocab_file={vocab}",
            f"dataloader.train.dataset.0.tokenizer.vocab_file={vocab}",
            f"dataloader.test.0.dataset.tokenizer.vocab_file={vocab}",
            f"dataloader.train.dataset.0.data_dir={root / 'afqmc'}",
            f"dataloader.test.0.dataset.data_dir={root / 'afqmc'}",
            "+train.evaluation.evaluator={_target_:libai.evaluation.ClsEvaluator,topk:[1]}",
        ]
    if project == SIMCSE:  # (no pretrained BERT file: the run starts from its own init)
        return [
            f"tokenization.tokenizer.vocab_file={vocab}",
            f"dataloader.train.dataset.0.tokenizer.vocab_file={vocab}",
            f"dataloader.train.dataset.0.path={root / 'snli.jsonl'}",
            "dataloader.train.dataset.0.max_len=16",
            *(f"dataloader.test.{i}.dataset.tokenizer.vocab_file={vocab}" for i in (0, 1)),
            f"dataloader.test.0.dataset.path={root / 'sts-test.txt'}",
            f"dataloader.test.1.dataset.path={root / 'sts-dev.txt'}",
            "model.cfg.pretrained_model_weight=null",
            "train.dist.data_parallel_size=1",
        ]
    return [
        f"tokenization.tokenizer.vocab_file={vocab}",
        f"dataloader.train.dataset.0.data_paths=[{root / 'train.tsv'}]",
        f"dataloader.test.0.dataset.data_paths=[{root / 'dev.tsv'}]",
    ]


def run_project(project: str, data, out, opts, nproc: int = 1) -> str:
    sizes = (
        []
        if project == SIMCSE
        else [  # (SimCSE's data: 16 tokens; its loaders' defaults)
            "dataloader.train.num_workers=0",
            "dataloader.test.0.num_workers=0",
            f"dataloader.train.dataset.0.max_seq_length={SEQ}",
            f"dataloader.test.0.dataset.max_seq_length={SEQ}",
        ]
    )
    proc = run_train_net(
        project,
        [*data_overrides(project, data), *TINY, *sizes, *opts, f"train.output_dir={out}"],
        nproc=nproc,
        cwd=LIBAI_CHECKOUT,
    )
    return proc.stdout + proc.stderr


def losses(out) -> dict[int, float]:
    return {i: m["total_loss"] for i, m in read_metrics(out).items() if "total_loss" in m}


# ---- the reference: libai's BertModel + a torch head, on data tokenized here -----------------


def encode(pairs, tokenizer: BertTokenizer) -> dict[str, torch.Tensor]:
    """``[CLS] a [SEP] b [SEP]`` padded to SEQ, segment ids 0 / 1, mask 1 on tokens."""
    ids, types, mask = [], [], []
    for a, b, _ in pairs:
        first = [tokenizer.cls_token_id, *tokenizer.encode(a, add_special_tokens=False)]
        first.append(tokenizer.sep_token_id)
        second = [*tokenizer.encode(b, add_special_tokens=False), tokenizer.sep_token_id]
        row = first + second
        pad = SEQ - len(row)
        ids.append(row + [tokenizer.pad_token_id] * pad)
        types.append([0] * len(first) + [1] * len(second) + [0] * pad)
        mask.append([1] * len(row) + [0] * pad)
    return {k: torch.tensor(v) for k, v in (("ids", ids), ("types", types), ("mask", mask))}


def run_bert(out, encoder: str):
    """The run's final weights (torch's own reader of the checkpoint) and libai's
    ``BertModel`` holding those of ``encoder``, built from the run's config.yaml."""
    dcp_to_torch_save(out / "model_final", out / "weights.pt")
    state = torch.load(out / "weights.pt", weights_only=True)
    cfg = dict(LazyConfig.load(str(out / "config.yaml")).model.cfg)
    keys = set(inspect.signature(BertModel.__init__).parameters)
    cfg = {k: v for k, v in cfg.items() if k in keys}  # (the project's own keys left out)
    prefix = f"model.{encoder}."
    cfg["vocab_size"] = state[prefix + "embeddings.vocab_embeddings.weight"].shape[0]
    bert = BertModel(cfg=cfg).eval()
    bert.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    return state, cfg, bert


def reference(out, encoder: str, head: str):
    """The run's final weights in libai's ``BertModel`` and a torch ``Linear``:
    ``inputs -> logits``."""
    state, cfg, bert = run_bert(out, encoder)
    linear = torch.nn.Linear(cfg["hidden_size"], 2)
    linear.load_state_dict(
        {"weight": state[f"model.{head}.weight"], "bias": state[f"model.{head}.bias"]}
    )

    @torch.no_grad()
    def logits(batch):
        pooled = bert(batch["ids"], batch["mask"], batch["types"])["pooler_output"]
        return linear(pooled)

    return logits


@pytest.mark.parametrize(
    "project, encoder, head",
    [(TEXT_CLS, "model", "classifier"), (QQP, "language_model", "classification_head")],
)
def test_first_loss_and_accuracy_equal_an_independent_computation(
    data, tmp_path, project, encoder, head
):
    """One iteration over all 32 training pairs at lr 0 (so the saved weights are the ones
    the loss was computed with): the logged loss is the mean cross entropy of the reference
    model on our own tokenization; the run's dev accuracy is the reference's."""
    out = tmp_path / "run"
    log = run_project(
        project,
        data,
        out,
        [
            "train.train_micro_batch_size=32",
            "train.test_micro_batch_size=4",
            "train.train_iter=1",
            "train.train_epoch=0",
            "optim.lr=0.0",
            "train.evaluation.eval_period=1",
        ],
    )
    got = losses(out)
    assert list(got) == [0]
    tokenizer = BertTokenizer(vocab_file=str(data["root"] / "vocab.txt"), do_lower_case=True)
    logits = reference(out, encoder, head)
    pairs = data["pairs"][project]
    train = encode(pairs["train"], tokenizer)
    labels = torch.tensor([label for *_, label in pairs["train"]])
    want = F.cross_entropy(logits(train), labels).item()
    assert got[0] == pytest.approx(want, rel=1e-6)

    # the dev accuracy: a pair whose two logits the reference puts within float noise of
    # each other (QQP's head starts tiny) may go either way
    dev_labels = torch.tensor([label for *_, label in pairs["dev"]])
    dev_logits = logits(encode(pairs["dev"], tokenizer))
    tied = (dev_logits[:, 1] - dev_logits[:, 0]).abs() < 1e-5
    right = (dev_logits.argmax(-1) == dev_labels) & ~tied
    reported = [float(v) for v in re.findall(r"'Acc@1': ([0-9.]+)", log)]
    assert reported and int(tied.sum()) <= 2
    low, high = int(right.sum()), int(right.sum() + tied.sum())
    assert 100.0 * low / 8 <= reported[-1] <= 100.0 * high / 8, (reported, low, high)


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("text_cls_one") / "run"
    run_project(TEXT_CLS, data, out, _steps(micro=4))
    got = losses(out)
    assert sorted(got) == [0, 1, 2, 3] and len(set(got.values())) == 4
    return got


def _steps(micro: int) -> list[str]:
    return [
        f"train.train_micro_batch_size={micro}",
        "train.test_micro_batch_size=4",
        "train.train_iter=4",
        "train.train_epoch=0",
        "train.evaluation.eval_period=4",
    ]


@pytest.mark.parametrize(
    "layout, micro",
    [("data_parallel_size", 2), ("tensor_parallel_size", 4)],
    ids=["dp2", "tp2"],
)
def test_text_classification_on_two_processes_equals_one(
    data, tmp_path, one_process, layout, micro
):
    """The same global batch of 4 on dp2 (2 per rank) and on tp2: every loss equals the
    one-process run's; on tp2 the row-parallel classifier is saved as two shards of half the
    input features, one per rank."""
    out = tmp_path / "run"
    log = run_project(TEXT_CLS, data, out, [*_steps(micro), f"train.dist.{layout}=2"], nproc=2)
    got = losses(out)
    # data parallel: the one-time warning that project code sees each rank's share
    shared = "runs on each rank's share of the batch (2 ranks share it)" in log
    assert shared == (layout == "data_parallel_size")
    assert sorted(got) == sorted(one_process)
    for i, want in one_process.items():
        assert got[i] == pytest.approx(want, rel=1e-6), (i, got, one_process)
    if layout == "tensor_parallel_size":
        meta = read_checkpoint_metadata(str(out / "model_final"))
        chunks = meta.state_dict_metadata["model.classifier.weight"].chunks
        assert sorted(tuple(c.sizes) for c in chunks) == [(2, 16), (2, 16)]


# ---- SimCSE (supervised): its contrastive loss and Spearman against the formulas ---------------


def simcse_reference(out):
    """The run's weights in libai's ``BertModel`` (LiBai's post-LN layout, as the config
    says) and a torch ``Linear`` + tanh: ``ids, mask -> ([CLS] state, its MLP output)``."""
    state, cfg, bert = run_bert(out, "bert")
    dense = torch.nn.Linear(cfg["hidden_size"], cfg["hidden_size"])
    dense.load_state_dict(
        {"weight": state["model.mlp.dense.weight"], "bias": state["model.mlp.dense.bias"]}
    )

    @torch.no_grad()
    def embed(ids, mask):
        cls = bert(ids, mask)[0][:, 0]
        return cls, torch.tanh(dense(cls))

    return embed


def _ids(sentences, tokenizer, max_len):
    rows = [
        [tokenizer.cls_token_id, *tokenizer.encode(s, add_special_tokens=False)][: max_len - 1]
        for s in sentences
    ]
    rows = [r + [tokenizer.sep_token_id] for r in rows]
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (max_len - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (max_len - len(r)) for r in rows])
    return ids, mask


def test_simcse_loss_and_spearman_equal_the_formulas(data, tmp_path):
    """One iteration over all 16 triples at lr 0: the logged loss is supervised SimCSE's
    (Gao et al. 2021): each origin's positive is its entailment and each entailment's its
    origin, every other sentence of the batch (contradictions included) a negative, cosine
    similarity / 0.05; each test set's Spearman correlation is scipy's on the reference's
    cosine similarities of the two sentences' [CLS] states."""
    from scipy.stats import spearmanr

    out = tmp_path / "run"
    log = run_project(
        SIMCSE,
        data,
        out,
        [
            "model.cfg.max_position_embeddings=64",  # its test sets are padded to 64
            "train.train_micro_batch_size=16",
            "train.test_micro_batch_size=4",
            "train.train_iter=1",
            "train.train_epoch=0",
            "optim.lr=0.0",
            "train.evaluation.eval_period=1",
        ],
    )
    got = losses(out)
    assert list(got) == [0]
    tokenizer = BertTokenizer(vocab_file=str(data["root"] / "vocab.txt"))
    embed = simcse_reference(out)
    triples = data["pairs"][SIMCSE]["train"]
    flat = [sentence for triple in triples for sentence in triple]  # o0 e0 c0 o1 e1 c1 ...
    _, z = embed(*_ids(flat, tokenizer, 16))
    z = F.normalize(z, dim=-1)
    sim = (z @ z.T - torch.eye(len(flat)) * 1e12) / 0.05
    anchors = torch.tensor([i for i in range(len(flat)) if i % 3 != 2])
    positives = torch.where(anchors % 3 == 0, anchors + 1, anchors - 1)
    want = F.cross_entropy(sim[anchors], positives).item()
    assert got[0] == pytest.approx(want, rel=1e-5)

    reported = [float(v) for v in re.findall(r"'Spearman': (?:np\.float64\()?([-0-9.e]+)", log)]
    wanted = []
    for split in ("test", "dev"):
        pairs = data["pairs"][SIMCSE][split]
        a, _ = embed(*_ids([p[0] for p in pairs], tokenizer, 64))
        b, _ = embed(*_ids([p[1] for p in pairs], tokenizer, 64))
        cos = F.cosine_similarity(a, b, dim=-1)
        wanted.append(spearmanr(cos.numpy(), [p[2] for p in pairs]).correlation)
    assert reported[-2:] == pytest.approx(wanted, abs=1e-6)
