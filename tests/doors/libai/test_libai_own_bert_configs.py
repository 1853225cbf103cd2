"""LiBai's own BERT-family config files (tests/fixtures/libai/configs at 9dcbe3b2, unmodified:
bert_large_pretrain.py, roberta_pretrain.py, bert_classification.py) run through
tools/train_net.py with overrides only for sizes, run length and data paths -- plus
``graph.enabled=False`` to spare these tests torch.compile's start-up (the compile path of
LiBai's configs is tested on gpt2_pretrain.py), dropout 0 (its masks differ by rank by
design) and ``train.amp.enabled=False`` (layouts compared in fp32, to float rounding), as in
test_libai_own_configs.py."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
from train_net_helpers import ROOT, read_metrics, run_train_net

from libai.data.data_utils import MMapIndexedDatasetBuilder

LIBAI_CONFIGS = ROOT / "tests" / "fixtures" / "libai" / "configs"
WORDS = "the quick brown fox jumps over a lazy dog while model training reads data".split()
#: a WordPiece vocab with continuation pieces and Chinese characters (bert-cn-wwm masking)
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed", "##ing"]
BERT_VOCAB += ["中", "国", "人", "##国", "##人"]


def write_sentences(prefix, vocab_size: int, first_id: int, seed: int) -> str:
    """120 documents of 2-6 sentences of 4-12 random ids (LiBai's --split-sentences layout)."""
    rng = random.Random(seed)
    builder = MMapIndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for _ in range(120):
        for _ in range(rng.randint(2, 6)):
            sentence = [rng.randrange(first_id, vocab_size) for _ in range(rng.randint(4, 12))]
            builder.add_item(np.asarray(sentence))
        builder.end_document()
    builder.finalize(str(prefix) + ".idx")
    return str(prefix)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    root = tmp_path_factory.mktemp("libai_bert_family")
    (root / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(50)],
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.save_model(str(root))
    return {
        "bert": write_sentences(root / "bert", len(BERT_VOCAB), 5, seed=1),
        "vocab_txt": str(root / "vocab.txt"),
        "roberta": write_sentences(root / "roberta", bpe.get_vocab_size(), 5, seed=2),
        "vocab_json": str(root / "vocab.json"),
        "merges": str(root / "merges.txt"),
    }


def overrides(data, kind: str, out_dir, micro: int, iters: int = 4) -> list[str]:
    """Sizes, run length, data paths (and graph.enabled, dropout): see the module doc."""
    prefix = data["roberta" if kind == "roberta" else "bert"]
    paths = [f"tokenization.tokenizer.vocab_file={data['vocab_txt']}"]
    if kind == "roberta":
        paths = [
            f"tokenization.tokenizer.vocab_file={data['vocab_json']}",
            f"tokenization.tokenizer.merges_file={data['merges']}",
        ]
    paths += [
        f"dataloader.train.dataset.0.data_prefix={prefix}",
        f"dataloader.train.dataset.0.indexed_dataset.data_prefix={prefix}",
    ]
    if kind != "classification":  # its config has no test loader
        paths += [
            f"dataloader.test.0.dataset.data_prefix={prefix}",
            f"dataloader.test.0.dataset.indexed_dataset.data_prefix={prefix}",
            "dataloader.test.0.dataset.max_seq_length=32",
        ]
    return [
        *paths,
        "model.cfg.hidden_layers=2",
        "model.cfg.hidden_size=32",
        "model.cfg.num_attention_heads=2",
        "model.cfg.intermediate_size=64",
        f"model.cfg.max_position_embeddings={34 if kind == 'roberta' else 32}",
        "model.cfg.hidden_dropout_prob=0.0",
        "model.cfg.attention_probs_dropout_prob=0.0",
        *(["model.cfg.classifier_dropout=0.0"] if kind == "classification" else []),
        "dataloader.train.dataset.0.max_seq_length=32",
        "dataloader.train.num_workers=0",
        "train.dist.pipeline_num_layers=2",
        f"train.train_micro_batch_size={micro}",
        f"train.test_micro_batch_size={micro}",  # the same evaluation samples on 1 and 2 ranks
        f"train.train_iter={iters}",
        "train.log_period=1",
        "train.checkpointer.period=2",
        f"train.evaluation.eval_period={iters}",
        "train.evaluation.eval_iter=2",
        "graph.enabled=False",
        "train.amp.enabled=False",
        f"train.output_dir={out_dir}",
    ]


def losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


CONFIGS = {
    "bert": "bert_large_pretrain.py",
    "roberta": "roberta_pretrain.py",
    "classification": "bert_classification.py",
}


@pytest.fixture(scope="module")
def one_process_runs(data, tmp_path_factory):
    """The one-process run of each config, made on first use and shared by the tests."""
    runs = {}

    def get(kind: str):
        if kind not in runs:
            out = tmp_path_factory.mktemp(f"one_{kind}")
            proc = run_train_net(LIBAI_CONFIGS / CONFIGS[kind], overrides(data, kind, out, 2))
            runs[kind] = (out, proc.stdout + proc.stderr)
        return runs[kind]

    return get


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_runs_unmodified_on_one_and_two_processes(data, one_process_runs, tmp_path, kind):
    """One process (micro-batch 2) and two (dp=2 derived from the launch, micro-batch 1) give
    the same losses on the same global batch: the masked-LM loss is the token mean over the
    whole data-parallel batch, as LiBai's global loss (the ranks hold unequal numbers of
    masked tokens). In fp32 (the configs' bf16 autocast off), so equal to float rounding:
    under bf16 the layouts differ by about 5e-5, more on some CPUs. Evaluation runs with
    LiBai's evaluators on LiBai's batch names."""
    config = LIBAI_CONFIGS / CONFIGS[kind]
    one, log = one_process_runs(kind)
    two = run_train_net(config, overrides(data, kind, tmp_path / "two", micro=1), nproc=2)
    assert "bias_gelu_fusion" in log  # LiBai's model keys with no effect are named
    assert "using 2, as LiBai does" in two.stdout + two.stderr
    want = losses(one)
    assert len(want) == 4
    assert losses(tmp_path / "two") == pytest.approx(want, rel=1e-6)
    final = read_metrics(one)[3]
    metric = "Acc@1" if kind == "classification" else "ppl"
    assert metric in final, final
    assert read_metrics(tmp_path / "two")[3][metric] == pytest.approx(final[metric], rel=1e-6)
    assert "nan" not in json.dumps(read_metrics(one)).lower()


def test_bert_large_pretrain_eval_only_and_resume(data, one_process_runs, tmp_path):
    """``--eval-only`` on the trained weights reports the perplexity that the run's own final
    evaluation reported; ``--resume`` from the iteration-2 checkpoint gives the uninterrupted
    run's losses of iterations 2 and 3 bit for bit."""
    config = LIBAI_CONFIGS / CONFIGS["bert"]
    trained, _ = one_process_runs("bert")
    straight = read_metrics(trained)
    out = tmp_path / "run"  # a copy of the run, resumed from its iteration-2 checkpoint
    shutil.copytree(trained, out)
    opts = overrides(data, "bert", out, micro=2)
    evaluated = run_train_net(
        config,
        [
            *overrides(data, "bert", tmp_path / "eval", micro=2),
            f"train.load_weight={trained}/model_final",
        ],
        extra_args=("--eval-only",),
    )
    log = evaluated.stdout + evaluated.stderr
    assert "Starting training" not in log
    assert f"'ppl': {straight[3]['ppl']}" in log, (straight[3], log[-2000:])
    (out / "last_checkpoint").write_text("model_0000001\n")
    (out / "metrics.json").unlink()
    resumed = run_train_net(config, opts, extra_args=("--resume",))
    assert "Resumed at iteration 2" in resumed.stdout + resumed.stderr
    again = read_metrics(out)
    assert [again[i]["total_loss"] for i in (2, 3)] == [straight[i]["total_loss"] for i in (2, 3)]
