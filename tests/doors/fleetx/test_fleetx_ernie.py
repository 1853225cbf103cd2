"""FleetX's ERNIE pretraining YAML (tests/fixtures/fleetx, byte for byte, with its _base_)
through ``Model.module: ErnieModule`` on the zoo's BERT, shrunk by ``-o``: the model follows
FleetX's ``Model`` keys (task-type embedding included), and its masked-LM + sentence-pair
loss equals transformers' ``ErnieForPreTraining`` on the same weights and batch (exported
to and loaded back from a transformers ERNIE directory). FleetX's ``ErnieDataset`` reads
FleetX's ERNIE corpus format (split, pairs and masking checked against the corpus here), and
the file runs through tools/train.py with a first-step loss equal to transformers' on the
same first batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_helpers import run_tool
from fleetx_reference import FLEETX
from omegaconf import OmegaConf
from train_net_helpers import read_metrics

from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config
from libai.fleetx.yaml_setup import resolve_module_class

YAML = FLEETX / "ppfleetx/configs/nlp/ernie/pretrain_ernie_base_345M_single_card.yaml"
TINY = [
    "Global.device=cpu",
    "Model.vocab_size=64",
    "Model.hidden_size=32",
    "Model.num_hidden_layers=2",
    "Model.num_attention_heads=2",
    "Model.max_position_embeddings=64",
    "Model.hidden_dropout_prob=0.0",
    "Model.attention_probs_dropout_prob=0.0",
    "Model.task_id=1",
    # 10 x the file's 0.02: padding masks and token types move the loss well past tolerance
    "Model.initializer_range=0.2",
]


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """A local vocab.txt (64 ids) for Data.*.dataset.tokenizer_type, as overrides."""
    path = tmp_path_factory.mktemp("ernie_vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return [f"Data.{s}.dataset.tokenizer_type={path}" for s in ("Train", "Eval")]


def _module(vocab, overrides=()):
    cfg = load_yaml_config(YAML, [*TINY, *vocab, *overrides])
    torch.manual_seed(0)
    return resolve_module_class(cfg.Model.module)(cfg)


def _batch(vocab=64, seq=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (3, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ids[1, 9:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = torch.randint(0, 4, (3, 1), generator=g)  # type_vocab_size 4 in the YAML
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5, 7]] = torch.randint(1, vocab, (3, 3), generator=g)
    labels[1, 7] = -100
    ns = torch.tensor([0, 1, 1])
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "tokentype_ids": types,
        "lm_labels": labels,
        "ns_labels": ns,
    }


def _hf_loss(path, batch, task_id):
    from transformers import ErnieForPreTraining

    hf = ErnieForPreTraining.from_pretrained(path).eval()
    with torch.no_grad():
        out = hf(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["tokentype_ids"],
            task_type_ids=torch.full_like(batch["input_ids"], task_id),
            labels=batch["lm_labels"],
            next_sentence_label=batch["ns_labels"],
        )
    return out.loss


def _loss(module, batch):
    module.train()
    with torch.no_grad():
        out = module.model(**module.pretreating_batch(batch))
    return sum(out.values()), out


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vocab):
    from libai.models.utils import save_huggingface

    module = _module(vocab)
    path = tmp_path_factory.mktemp("ernie_hf")
    save_huggingface(module.model, str(path))
    return module, path


def test_ernie_module_follows_fleetx_model_keys(exported):
    module, path = exported
    cfg = module.model.bert.libai_cfg
    # the 345M file's keys (intermediate_size null = 4 x hidden, as FleetX's module)
    assert cfg["num_tokentypes"] == 4 and cfg["intermediate_size"] == 128
    assert cfg["hidden_layers"] == 2 and cfg["activation"] == "gelu"
    emb = module.model.bert.embeddings
    assert emb.task_type_embeddings.weight.shape == (3, 32) and emb.task_id == 1
    hf_cfg = json.loads((path / "config.json").read_text())
    assert hf_cfg["model_type"] == "ernie" and hf_cfg["use_task_id"] is True
    assert (hf_cfg["type_vocab_size"], hf_cfg["task_type_vocab_size"]) == (4, 3)


def test_ernie_module_keeps_a_given_intermediate_size(vocab):
    """``Model.intermediate_size`` given: the feed-forward width is that, not FleetX's
    4 x hidden default (which applies only when it is null)."""
    module = _module(vocab, ["Model.intermediate_size=48"])
    assert module.model.bert.libai_cfg["intermediate_size"] == 48
    widths = {
        tuple(m.weight.shape)
        for name, m in module.model.named_modules()
        if name.endswith("dense_h_to_4h")
    }
    assert widths == {(48, 32)}


@pytest.mark.parametrize("own", ["Train", "Eval", "Test"])
def test_every_split_of_ernie_datasets_follows_binary_head(vocab, own):
    """FleetX's ErnieModule gives each split's ``ErnieDataset`` (Train, Eval and Test) the
    ``Global.binary_head`` of the file unless the dataset section sets its own."""
    module = _module(vocab)
    splits = ("Train", "Eval", "Test")
    cfg = OmegaConf.create(
        {
            "Global": {"binary_head": False},
            "Data": {split: {"dataset": {"name": "ErnieDataset"}} for split in splits},
        }
    )
    cfg.Data[own].dataset.binary_head = True  # its own
    module.process_configs(cfg)
    got = {split: cfg.Data[split].dataset.binary_head for split in splits}
    assert got == {split: split == own for split in splits}


def test_ernie_module_loss_equals_transformers(exported, vocab):
    module, path = exported
    batch = _batch()
    total, out = _loss(module, batch)
    assert set(out) == {"lm_loss", "sop_loss"}  # Global.binary_head: True in the base file
    torch.testing.assert_close(total, _hf_loss(path, batch, task_id=1), rtol=1e-5, atol=1e-6)
    # the same weights loaded back through Model.pretrained give the same loss
    loaded = _module(vocab, [f"+Model.pretrained={path}"])
    torch.testing.assert_close(_loss(loaded, batch)[0], total, rtol=1e-6, atol=1e-6)


def test_fleetx_collate_batches_give_the_same_loss(exported):
    """A batch laid out as FleetX's ErnieCollateData (additive mask, flattened masked
    positions padded to a multiple of 8 with label -1, [batch, 1] sentence labels), built
    here from the mapping batch, gives the mapping batch's loss."""
    module, _ = exported
    batch = _batch()
    b, s = batch["input_ids"].shape
    flat = batch["lm_labels"].reshape(-1)
    positions = (flat != -100).nonzero().flatten()
    pad = -len(positions) % 8
    fleetx = (
        batch["input_ids"],
        batch["tokentype_ids"],
        ((1 - batch["attention_mask"]) * -1e4).float().reshape(b, 1, 1, s),
        torch.cat([positions, torch.zeros(pad, dtype=torch.long)]).int(),
        torch.cat([flat[positions], torch.full((pad,), -1)]).reshape(-1, 1),
        batch["ns_labels"].reshape(-1, 1),
    )
    torch.testing.assert_close(_loss(module, fleetx)[0], _loss(module, batch)[0], rtol=0, atol=1e-6)


def test_binary_head_off_is_masked_lm_only(exported):
    module, _ = exported
    module.cfg.Global.binary_head = False
    try:
        total, out = _loss(module, _batch())
    finally:
        module.cfg.Global.binary_head = True
    assert set(out) == {"lm_loss"}


def test_ernie_module_errors(vocab):
    with pytest.raises(ValueError, match="Model.task_id=5 .*task_type_vocab_size=3"):
        _module(vocab, ["Model.task_id=5"])
    with pytest.raises(ValueError, match="unknown config key Model.num_layerz"):
        _module(vocab, ["+Model.num_layerz=3"])
    # FleetX's PaddleNLP hub name (the file's own value): no download, the key is named
    hub = "Data.Train.dataset.tokenizer_type='ernie-1.0-base-zh-cw' is not a local file"
    with pytest.raises(ValueError, match=hub):
        _module([])
    with pytest.raises(YAMLConfigError, match="ErnieModuleAuto .*the closest is ErnieModule"):
        resolve_module_class("ErnieModuleAuto")


def write_ernie_corpus(root, num_docs=40, seed=0):
    """A vocab.txt (64 ids) and FleetX's ERNIE corpus (``_ids.npy``; ``_idx.npz`` with
    ``lens`` per sentence and ``docs`` = first sentence of each document) under ``root``;
    returns the documents as lists of sentences."""
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    rng = np.random.RandomState(seed)
    documents = [
        [rng.randint(5, 64, rng.randint(3, 9)) for _ in range(rng.randint(2, 6))]
        for _ in range(num_docs)
    ]
    sentences = [s for doc in documents for s in doc]
    docs = np.cumsum([0] + [len(doc) for doc in documents])
    (root / "data").mkdir()
    np.save(root / "data" / "corpus_ids.npy", np.concatenate(sentences).astype(np.int32))
    np.savez(
        root / "data" / "corpus_idx.npz",
        lens=np.asarray([len(s) for s in sentences], np.int32),
        docs=docs.astype(np.int64),
    )
    return documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("ernie_corpus")
    documents = write_ernie_corpus(root)
    data = [
        f"Data.{split}.dataset.{key}"
        for split in ("Train", "Eval")
        for key in (
            f"input_dir={root / 'data'}",
            f"tokenizer_type={root / 'vocab.txt'}",
            "max_seq_length=48",
            "short_seq_prob=0.0",
        )
    ]
    return root, documents, data


def test_ernie_dataset_reads_fleetx_corpus(corpus):
    from libai.data.datasets.fleetx_ernie import ErnieDataset
    from libai.fleetx.modules.ernie import ernie_tokenizer

    root, documents, _ = corpus
    kw = dict(input_dir=str(root / "data"), tokenizer=ernie_tokenizer(root / "vocab.txt"))
    kw.update(max_seq_length=48, masked_lm_prob=0.15, short_seq_prob=0.0, seed=1024)
    train = ErnieDataset(**kw, split=[949, 50, 1], mode="Train")
    # FleetX's split of 40 documents: round(40 * 949/1000) = 38, round(40 * 50/1000) = 2
    assert train.documents.tolist() == list(range(38))
    eval_docs = ErnieDataset(**kw, split=[949, 50, 1], mode="Eval").documents
    assert eval_docs.tolist() == [38, 39]
    whole = {tuple(np.concatenate(doc)): i for i, doc in enumerate(documents)}
    seen = set()
    for i in range(len(train)):
        sample = train[i]
        ids, labels = sample["input_ids"], sample["lm_labels"]
        n = int(sample["attention_mask"].sum())
        masked = labels != -100
        # masked positions: real, non-special tokens; [MASK] 80% / random / kept
        assert masked.sum() >= 1 and not masked[n:].any() and not masked[0]
        restored = torch.where(masked, labels, ids)[:n]
        seps = (restored == 3).nonzero().flatten().tolist()
        assert restored[0] == 2 and len(seps) == 2 and seps[1] == n - 1
        a, b = restored[1 : seps[0]].tolist(), restored[seps[0] + 1 : n - 1].tolist()
        assert (sample["tokentype_ids"][:n] == (torch.arange(n) > seps[0])).all()
        # each run is one whole document here (short docs, no truncation): B follows A, or
        # the two are swapped and ns_labels = 1 (FleetX's is_next_random)
        pair = a + b if sample["ns_labels"] == 0 else b + a
        seen.add(whole[tuple(pair)])
    assert seen == set(range(38))


def test_ernie_dataset_errors(corpus, tmp_path):
    from libai.data.datasets.fleetx_ernie import ErnieDataset
    from libai.fleetx.modules.ernie import ernie_tokenizer

    root, _, _ = corpus
    tokenizer = ernie_tokenizer(root / "vocab.txt")
    with pytest.raises(ValueError, match="Test split .* has no documents"):
        ErnieDataset(str(root / "data"), split=[1, 1, 0], mode="Test", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="ErnieDataset needs a tokenizer"):
        ErnieDataset(str(root / "data"), "vocab.txt")


def test_fleetx_ernie_yaml_trains_with_first_loss_of_transformers(corpus, tmp_path):
    """tools/train.py on FleetX's file; the first step's loss equals transformers'
    ErnieForPreTraining with the same initial weights on the same first batch; mp2 on two
    processes gives the same losses."""
    from libai.data.datasets.fleetx_ernie import ErnieCollateData
    from libai.fleetx.yaml_setup import build_module, setup_yaml_run
    from libai.models.utils import save_huggingface

    _, _, data = corpus
    size = [o for o in TINY if "task_id" not in o]  # the file's task_id: 0
    run = [
        *size,
        *data,
        "Global.local_batch_size=4",
        "Global.micro_batch_size=4",
        "Engine.max_steps=2",
        "Engine.eval_freq=100",
        "Engine.logging_freq=1",
        "Data.Eval.loader.num_workers=0",
        f"Engine.save_load.output_dir={tmp_path / 'out'}",
    ]
    run_tool("train", YAML, *run)
    first = read_metrics(tmp_path / "out")[0]["total_loss"]
    # reference: the same seeded build in this process, exported to transformers
    cfg = load_yaml_config(YAML, [*run[:-1], f"Engine.save_load.output_dir={tmp_path / 'ref'}"])
    setup_yaml_run(cfg)
    module = build_module(cfg)
    save_huggingface(module.model, str(tmp_path / "hf"))
    from libai.fleetx.yaml_loaders import build_split_dataset

    dataset = build_split_dataset(
        cfg.Data.Train, "Train", seed=1024, num_samples=8, tokenizer=module.tokenizer
    )
    batch = ErnieCollateData()([dataset[i] for i in range(4)])
    reference = _hf_loss(tmp_path / "hf", batch, task_id=0)
    assert first == pytest.approx(float(reference), rel=1e-5)
    # tensor parallel (mp2 on 2 processes): the losses of the one-process run, step by step
    one = [m["total_loss"] for _, m in sorted(read_metrics(tmp_path / "out").items())]
    mp2 = tmp_path / "mp2"
    run_tool(
        "train",
        YAML,
        *run[:-1],
        "Distributed.mp_degree=2",
        f"Engine.save_load.output_dir={mp2}",
        nproc=2,
    )
    got = [m["total_loss"] for _, m in sorted(read_metrics(mp2).items())]
    assert len(one) == 2 and got == pytest.approx(one, rel=1e-5)


FINETUNE = FLEETX / "ppfleetx/configs/nlp/ernie/finetune_ernie_345M_single_card.yaml"


def test_ernie_seq_cls_module_loss_equals_transformers(vocab, tmp_path):
    """FleetX's ERNIE fine-tuning file's module: the classification loss and logits equal
    transformers' ErnieForSequenceClassification on the same weights (exported)."""
    from transformers import ErnieForSequenceClassification

    from libai.models.utils import save_huggingface

    cfg = load_yaml_config(FINETUNE, [*TINY, *vocab, "+Model.num_classes=3"])
    torch.manual_seed(0)
    module = resolve_module_class(cfg.Model.module)(cfg)
    assert type(module).__name__ == "ErnieSeqClsModule" and module.model.num_labels == 3
    save_huggingface(module.model, str(tmp_path))
    batch = {k: v for k, v in _batch().items() if k in ("input_ids", "attention_mask")}
    batch["token_type_ids"] = _batch()["tokentype_ids"]  # FleetX's / transformers' name
    batch["labels"] = torch.tensor([0, 2, 1])
    module.eval()
    with torch.no_grad():
        out = module.model(**batch)
        hf = ErnieForSequenceClassification.from_pretrained(str(tmp_path)).eval()
        task = torch.full_like(batch["input_ids"], 1)
        want = hf(**batch, task_type_ids=task)
    torch.testing.assert_close(out["logits"], want.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss"], want.loss, rtol=1e-5, atol=1e-6)
    # FleetX's data set of the file (PaddleNLP's, by name): a one-line error
    from libai.fleetx.yaml_loaders import build_split_dataset

    with pytest.raises(ValueError, match="ErnieSeqClsDataset .*chnsenticorp_v2.*TextClass"):
        build_split_dataset(cfg.Data.Train, "Train", seed=0, tokenizer=module.tokenizer)
    step = module.validation_step(batch)
    assert (
        step["count"] == 3 and step["correct"] == (want.logits.argmax(-1) == batch["labels"]).sum()
    )


def _runs(mask: np.ndarray) -> list[int]:
    """Lengths of the maximal runs of True in ``mask``."""
    runs, n = [], 0
    for m in [*mask.tolist(), False]:
        if m:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_whole_word_ngram_masking_rules():
    """FleetX's masking rules, checked on 300 draws: a word's ``##`` pieces are masked with
    it, never more than round(0.15 x tokens) tokens (at least one), labels are the original
    tokens, ~80% become [MASK]; longer n-grams (favor_longer_ngram) give longer masked runs
    than max_ngrams=1."""
    from libai.data.datasets.fleetx_ernie import whole_word_ngram_mask

    vocab = 64
    continuation = np.zeros(vocab, dtype=bool)
    continuation[40:] = True  # ids >= 40 are "##" pieces
    g = np.random.RandomState(0)
    tokens = g.randint(5, 40, 60)
    pieces = g.rand(60) < 0.4  # some pieces continue the word before them
    tokens[pieces] = g.randint(40, vocab, pieces.sum())
    tokens[0] = 7  # a sequence starts with a word
    candidates = np.ones(60, dtype=bool)
    candidates[[0, 30]] = False  # e.g. [CLS] / [SEP] positions
    word_of = np.cumsum(~continuation[tokens] | ~candidates | ~np.roll(candidates, 1))
    budget = round(60 * 0.15)
    runs = {}
    masked_total = replaced = 0
    for max_ngrams, favor in ((1, False), (3, True)):
        lengths = []
        for seed in range(150):
            rng = np.random.default_rng(seed)
            args = (tokens, candidates, continuation, 0.15, max_ngrams, favor, 4, vocab, rng)
            ids, labels = whole_word_ngram_mask(*args)
            masked = labels != -100
            assert 1 <= masked.sum() <= budget and not masked[~candidates].any()
            assert (labels[masked] == tokens[masked]).all() and (
                ids[~masked] == tokens[~masked]
            ).all()
            for w in np.unique(word_of[masked]):  # whole words only
                assert masked[(word_of == w) & candidates].all()
            masked_total += masked.sum()
            replaced += (ids[masked] == 4).sum()
            lengths += _runs(masked)
        runs[max_ngrams] = np.mean(lengths)
    assert 0.7 < replaced / masked_total < 0.9
    assert runs[3] > runs[1] + 0.5
