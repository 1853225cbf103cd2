"""LiBai's own Llama project (tests/fixtures/libai/projects/Llama, LiBai 9dcbe3b2, unmodified:
its model, HF loader, tokenizer, dataset, SFT config and entry script) fine-tunes a tiny
Hugging Face Llama, run with LiBai's own command from the checkout's root:

    bash tools/train.sh projects/Llama/train_net.py projects/Llama/configs/llama_sft.py 1 ...

with overrides only for sizes, run length and data paths (plus fp32 and no activation
checkpointing, as the other LiBai tests). Its loader (``LlamaLoaderHuggerFace``, LiBai's
``_convert_state_dict`` / ``_load_config_from_json`` hooks) fills the model from the
Hugging Face files; ``tools/train.sh`` runs the script through ``libai.oneflow_api.run``.

- the first loss equals transformers' ``LlamaForCausalLM`` on the same weights and batch
  (the project's loss: labels shifted by its data preparation, ids 0 and -1 ignored);
- dp2 equals one process (every iteration's loss, fp32).

The dataset is written as the project's ``utils/prepare_alpaca.py`` writes it (a list of
``{"input_ids", "labels"}`` tensors saved with ``flow.save``): that script downloads the
Alpaca JSON and reads its paths from defaults, so it is not run here.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from train_net_helpers import ROOT, read_metrics, run_project_script, train_env

LIBAI_CHECKOUT = ROOT / "tests" / "fixtures" / "libai"
SCRIPT = "projects/Llama/train_net.py"
CONFIG = "projects/Llama/configs/llama_sft.py"
RUN_PY = ROOT / "libai" / "oneflow_api" / "run.py"
WORDS = "the quick brown fox jumps over a lazy dog while model training reads data".split()
SEQ = 24


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny Hugging Face Llama (no GQA: the project's attention has none) with a
    SentencePiece ``tokenizer.model``, and 12 training / 4 test samples."""
    import sentencepiece as spm
    import transformers

    root = tmp_path_factory.mktemp("libai_llama")
    hf = root / "hf"
    hf.mkdir()
    corpus = [" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(200)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_prefix=str(hf / "tokenizer"),
        model_type="unigram",
        vocab_size=60,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=sp.get_piece_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(hf)
    rng = random.Random(1)
    samples = []
    for _ in range(16):  # prepare_alpaca.py's layout: ids[:-1] in, ids[1:] out, -1 ignored
        ids = [1, *sp.encode(" ".join(rng.choices(WORDS, k=rng.randint(4, 10)))), 2]
        prompt = rng.randint(1, 3)
        ids = ids + [-1] * (SEQ + 1 - len(ids))
        labels = [-1] * prompt + ids[prompt:]
        example = [max(t, 0) for t in ids]
        samples.append(
            {"input_ids": torch.tensor(example[:-1]), "labels": torch.tensor(labels[1:])}
        )
    (root / "alpaca").mkdir()
    torch.save(samples[:12], root / "alpaca" / "train")
    torch.save(samples[12:], root / "alpaca" / "test")
    return {"hf": hf, "data": root / "alpaca", "samples": samples}


def overrides(files, out, micro: int) -> list[str]:
    hf, data, model = files["hf"], files["data"], files["hf"] / "tokenizer.model"
    return [
        f"model.cfg.pretrained_model_path={hf}",
        f"tokenization.tokenizer.pretrained_model_path={model}",
        f"dataloader.train.dataset.0.tokenizer.pretrained_model_path={model}",
        f"dataloader.test.0.dataset.tokenizer.pretrained_model_path={model}",
        f"dataloader.train.dataset.0.path={data / 'train'}",
        f"dataloader.test.0.dataset.path={data / 'test'}",
        # the sizes config.json gives (the loader would set them from it too)
        "model.cfg.hidden_size=32",
        "model.cfg.hidden_layers=2",
        "model.cfg.num_attention_heads=4",
        "model.cfg.intermediate_size=64",
        "model.cfg.max_position_embeddings=64",
        "model.cfg.vocab_size=60",
        "train.dist.pipeline_parallel_size=1",
        "train.dist.pipeline_num_layers=2",
        "train.num_accumulation_steps=1",
        f"train.train_micro_batch_size={micro}",
        "train.train_epoch=0",
        "train.train_iter=3",
        "train.log_period=1",
        "train.evaluation.eval_period=3",
        "train.amp.enabled=False",
        "train.activation_checkpoint.enabled=False",
        f"train.output_dir={out}",
    ]


def losses(out) -> dict[int, float]:
    return {i: m["total_loss"] for i, m in read_metrics(out).items() if "total_loss" in m}


def test_first_loss_equals_transformers_through_libais_own_command(files, tmp_path):
    """LiBai's command (tools/train.sh with the project's script), one process, the 12
    training samples in one batch: the first loss is transformers' Llama's on the same
    Hugging Face weights, under the project's loss (mean over labels other than 0 / -1)."""
    import transformers

    out = tmp_path / "run"
    opts = overrides(files, out, micro=12)
    proc = run_project_script(SCRIPT, CONFIG, opts, cwd=LIBAI_CHECKOUT, launcher="train.sh")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = losses(out)
    assert sorted(got) == [0, 1, 2]
    assert "'ppl':" in proc.stdout + proc.stderr  # its PPLEvaluator ran on the test split

    hf = transformers.LlamaForCausalLM.from_pretrained(files["hf"]).eval()
    train = files["samples"][:12]
    ids = torch.stack([s["input_ids"] for s in train])
    labels = torch.stack([s["labels"] for s in train])
    with torch.no_grad():
        logits = hf(ids).logits
    keep = labels > 0
    want = F.cross_entropy(logits[keep], labels[keep]).item()
    assert got[0] == pytest.approx(want, rel=1e-5)


def test_dp2_equals_one_process(files, tmp_path):
    """The same global batch of 4: every loss on dp2 (2 per rank) equals one process."""
    runs = {}
    for name, nproc, micro in (("one", 1, 4), ("dp2", 2, 2)):
        out = tmp_path / name
        opts = [*overrides(files, out, micro), f"train.dist.data_parallel_size={nproc}"]
        proc = run_project_script(SCRIPT, CONFIG, opts, nproc=nproc, cwd=LIBAI_CHECKOUT)
        assert proc.returncode == 0, proc.stdout[-4000:]
        runs[name] = losses(out)
    assert sorted(runs["one"]) == [0, 1, 2] and len(set(runs["one"].values())) == 3
    for i, want in runs["one"].items():
        assert runs["dp2"][i] == pytest.approx(want, rel=1e-6), runs


#: a user's script: LiBai's TextGenerationPipeline (the project's pipeline.py) on the
#: Hugging Face directory, with a user config that gives llama_config.py's tokenizer its file
_GENERATE = """
import json, sys
from projects.Llama.pipeline import TextGenerationPipeline

pipeline = TextGenerationPipeline(
    sys.argv[1], model_path=sys.argv[2], mode="huggingface", device="cpu"
)
print("RESULT", json.dumps(pipeline(inputs=[sys.argv[3]])))
"""

_USER_CONFIG = """
from projects.Llama.configs.llama_config import cfg, model, tokenization, train  # noqa: F401

tokenization.tokenizer.pretrained_model_path = {model!r}
"""


def test_the_projects_generation_pipeline_equals_transformers_greedy(files, tmp_path):
    """The project's TextGenerationPipeline, its loader and its model's generate (50 tokens,
    greedy, as its pipeline asks): the text is transformers' greedy continuation of the same
    prompt ids, decoded by the same SentencePiece model."""
    import json

    import sentencepiece as spm
    import transformers

    (tmp_path / "generate.py").write_text(_GENERATE)
    config = tmp_path / "llama_generate.py"
    config.write_text(_USER_CONFIG.format(model=str(files["hf"] / "tokenizer.model")))
    prompt = "the quick fox"
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN_PY),
            str(tmp_path / "generate.py"),
            str(config),
            str(files["hf"]),
            prompt,
        ],
        cwd=LIBAI_CHECKOUT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])

    sp = spm.SentencePieceProcessor(model_file=str(files["hf"] / "tokenizer.model"))
    ids = torch.tensor([[sp.bos_id(), *sp.encode(prompt)]])
    hf = transformers.LlamaForCausalLM.from_pretrained(files["hf"]).eval()
    out = hf.generate(ids, max_length=50, do_sample=False, eos_token_id=2, pad_token_id=0)
    assert out.shape[1] > ids.shape[1] + 5  # a continuation, not an early end
    assert got == [{"generated_text": sp.decode(out[0].tolist())}]
