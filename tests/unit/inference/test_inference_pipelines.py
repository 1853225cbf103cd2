"""Inference pipelines: fill-mask (BERT, RoBERTa), text and image classification equal
``transformers``' pipelines on the same weights; ``mode="random"`` / ``"libai"`` build from a
config (and a trainer checkpoint); bad input fails clearly; dp2 / tp2 / pp2 (and a custom
``pipeline_stage_id``) under torchrun give rank 0 the single-process results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from inference_helpers import (
    BERT_MASKED,
    ROBERTA_MASKED,
    TEXTS,
    assert_same_results,
    make_bert_dir,
    make_images,
    make_roberta_dir,
    make_vit_dir,
)
from launch import torchrun

from libai.checkpoint.checkpointer import Checkpointer
from libai.inference import (
    FillMaskPipeline,
    ImageClassificationPipeline,
    TextClassificationPipeline,
)
from libai.models.utils import CheckpointError

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    return {
        "bert": make_bert_dir(root, num_layers=3),
        "bert_cls": make_bert_dir(root, "classification", seed=1, num_layers=3),
        "roberta": make_roberta_dir(root),
        "vit": make_vit_dir(root),
    }


def hf_pipeline(task, path, model_cls, **kw):
    if task == "image-classification":
        from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

        kw["image_processor"] = ViTImageProcessorPil.from_pretrained(path)
    else:
        kw["tokenizer"] = transformers.AutoTokenizer.from_pretrained(path)
    return transformers.pipeline(task, model=model_cls.from_pretrained(path), **kw)


# ---- parity with transformers ----------------------------------------------------------------
@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_fill_mask_matches_transformers(dirs, arch):
    hf_cls = transformers.BertForMaskedLM if arch == "bert" else transformers.RobertaForMaskedLM
    texts = BERT_MASKED if arch == "bert" else ROBERTA_MASKED
    ours = FillMaskPipeline(model_path=dirs[arch], mode="huggingface")
    theirs = hf_pipeline("fill-mask", dirs[arch], hf_cls)
    for inputs in (texts[0], texts, texts[:1], texts[2]):  # one mask, batch, list of one, 2 masks
        for kw in ({}, {"top_k": 3}):
            assert_same_results(ours(inputs, **kw), theirs(inputs, **kw))
    assert FillMaskPipeline(model_path=dirs[arch], mode="huggingface", top_k=2)(texts[0]) == ours(
        texts[0], top_k=2
    )  # init parameters are call defaults


def test_text_classification_matches_transformers(dirs):
    ours = TextClassificationPipeline(model_path=dirs["bert_cls"], mode="huggingface")
    theirs = hf_pipeline(
        "text-classification", dirs["bert_cls"], transformers.BertForSequenceClassification
    )
    for inputs in (TEXTS[0], TEXTS):
        for kw in ({}, {"top_k": 2}, {"top_k": None}, {"function_to_apply": "sigmoid"}):
            assert_same_results(ours(inputs, **kw), theirs(inputs, **kw))
    assert {r["label"] for r in ours(TEXTS[0], top_k=None)} == {"negative", "neutral", "positive"}


def test_image_classification_matches_transformers(dirs):
    ours = ImageClassificationPipeline(model_path=dirs["vit"], mode="huggingface")
    theirs = hf_pipeline(
        "image-classification", dirs["vit"], transformers.ViTForImageClassification
    )
    images = make_images()
    for inputs in (images[0], images):
        for kw in ({}, {"top_k": 2}, {"top_k": 10}):
            assert_same_results(ours(inputs, **kw), theirs(inputs, **kw))
    # numpy arrays (HWC and CHW) and files give the same as the PIL image
    array = np.asarray(images[0])
    want = ours(images[0])
    assert_same_results(ours(array), want)
    assert_same_results(ours(np.ascontiguousarray(array.transpose(2, 0, 1))), want)
    path = Path(dirs["vit"]) / "image.png"
    images[0].save(path)
    assert_same_results(ours(str(path)), want)


# ---- config modes ------------------------------------------------------------------------------
CONFIG = """
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.models import BertForPreTraining
from libai.tokenizer import BertTokenizer

model = LazyCall(BertForPreTraining)(
    cfg=dict(vocab_size={vocab_size}, hidden_size=32, hidden_layers=3, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0, initializer_range=0.3)
)
tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(BertTokenizer)(vocab_file="{vocab}")
train = OmegaConf.create(dict(seed=7, dist=dict()))
"""


def write_config_case(dirs, root: Path) -> dict:
    """A LazyConfig of a random BERT, and a trainer checkpoint of perturbed weights; returns
    ``{"config", "checkpoint", "expected": fill-mask results of the checkpoint}``."""
    vocab = Path(dirs["bert"]).parent / "vocab" / "vocab.txt"
    config = root / "bert_config.py"
    size = len(vocab.read_text(encoding="utf-8").splitlines())
    config.write_text(CONFIG.format(vocab_size=size, vocab=vocab))
    pipe = FillMaskPipeline(str(config), mode="random")
    random_result = pipe(BERT_MASKED)
    with torch.no_grad():
        for p in pipe.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    Checkpointer(pipe.model, str(root / "output")).save("model_final")
    expected = pipe(BERT_MASKED)
    assert expected != random_result
    return {"config": str(config), "checkpoint": str(root / "output"), "expected": expected}


def test_random_and_libai_modes(dirs, tmp_path):
    case = write_config_case(dirs, tmp_path)
    again = FillMaskPipeline(case["config"], mode="random")  # seeded by train.seed
    assert again(BERT_MASKED[0]) != case["expected"][0]
    assert again.model_path is None  # no directory: nothing is read from one
    for path in (case["checkpoint"], case["checkpoint"] + "/model_final"):
        pipe = FillMaskPipeline(case["config"], model_path=path, mode="libai")
        assert_same_results(pipe(BERT_MASKED), case["expected"], tol=1e-6)
    assert pipe.cfg.train.dist.tensor_parallel_size == 1  # the config shows the layout


# ---- bad input ---------------------------------------------------------------------------------
def test_bad_input_is_a_clear_error(dirs, tmp_path):
    no_weights = tmp_path / "no_weights"
    shutil.copytree(dirs["bert"], no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=f"no weights in {no_weights}"):
        FillMaskPipeline(model_path=str(no_weights), mode="huggingface")

    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(dirs["bert"], no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"no tokenizer in {no_tokenizer}.*vocab.txt"):
        FillMaskPipeline(model_path=str(no_tokenizer), mode="huggingface")

    with pytest.raises(CheckpointError, match="no config.json"):
        FillMaskPipeline(model_path=str(tmp_path), mode="huggingface")
    with pytest.raises(ValueError, match="mode must be one of.*'hf'"):
        FillMaskPipeline(model_path=dirs["bert"], mode="hf")
    with pytest.raises(ValueError, match="device must be"):
        FillMaskPipeline(model_path=dirs["bert"], mode="huggingface", device="tpu")
    with pytest.raises(ValueError, match="needs model_path"):
        FillMaskPipeline(mode="huggingface")
    with pytest.raises(ValueError, match="needs config_file"):
        FillMaskPipeline(model_path=dirs["bert"])  # mode="libai"
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['topk'\]"):
        FillMaskPipeline(model_path=dirs["bert"], mode="huggingface", topk=3)
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size"):
        FillMaskPipeline(model_path=dirs["bert"], mode="huggingface", tensor_parallel=2)
    with pytest.raises(ValueError, match="custom_pipeline_stage_id has 2 entries"):
        FillMaskPipeline(model_path=dirs["bert"], mode="huggingface", pipeline_stage_id=[0, 0])

    pipe = FillMaskPipeline(model_path=dirs["bert"], mode="huggingface")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['k'\]; accepted: \['top_k'\]"):
        pipe(BERT_MASKED[0], k=1)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        pipe(BERT_MASKED[0], top_k=0)
    with pytest.raises(ValueError, match=r"no mask token \(\[MASK\]\) found in the input 'hi'"):
        pipe("hi")
    with pytest.raises(ValueError, match="function_to_apply must be one of"):
        TextClassificationPipeline(
            model_path=dirs["bert_cls"], mode="huggingface", function_to_apply="relu"
        )
    image_pipe = ImageClassificationPipeline(model_path=dirs["vit"], mode="huggingface")
    with pytest.raises(TypeError, match="numpy images must be uint8"):
        image_pipe(np.zeros((16, 16, 3), dtype=np.float32))


# ---- parallel layouts ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dist_case(dirs, tmp_path_factory):
    """Single-process results of every pipeline the torchrun script runs on each layout."""
    root = tmp_path_factory.mktemp("inference_dist")
    images = make_images()
    for i, image in enumerate(images):
        image.save(root / f"image{i}.png")
    config_case = write_config_case(dirs, root)
    image_paths = [str(root / f"image{i}.png") for i in range(len(images))]
    expected = {
        "fill_mask": FillMaskPipeline(model_path=dirs["bert"], mode="huggingface")(
            BERT_MASKED, top_k=3
        ),
        "classify": TextClassificationPipeline(model_path=dirs["bert_cls"], mode="huggingface")(
            TEXTS, top_k=None
        ),
        "roberta": FillMaskPipeline(model_path=dirs["roberta"], mode="huggingface")(ROBERTA_MASKED),
        "image": ImageClassificationPipeline(model_path=dirs["vit"], mode="huggingface")(
            image_paths
        ),
        "libai": config_case["expected"],
    }
    spec = {**dirs, **config_case, "images": image_paths, "expected": expected}
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def check_dist(results: list[dict], layouts: list[str]) -> None:
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        assert sorted(r["layouts"]) == sorted(layouts)
        for name, checks in r["layouts"].items():
            for task, outcome in checks.items():
                want = "equal" if rank == 0 else "None"
                assert outcome == want, f"rank {rank} {name} {task}: {outcome}"


def test_two_processes_dp_tp_pp(dist_case):
    """dp2, tp2, pp2 (even split [0, 0, 1]) and pp2 with pipeline_stage_id [0, 1, 1]."""
    results = torchrun("inference_layouts.py", 2, dist_case)
    check_dist(results, ["dp2", "tp2", "pp2", "pp2_custom"])
    pp = results[1]["stage_params"]["pp2"]  # the last stage holds only its layer and heads
    assert pp["encoders"] == ["2"] and not pp["embeddings"] and pp["heads"]
    assert results[1]["stage_params"]["pp2_custom"]["encoders"] == ["1", "2"]
    for r in results:  # tp2 holds half the qkv rows on each rank
        assert r["stage_params"]["tp2"]["qkv_rows"] * 2 == r["stage_params"]["dp2"]["qkv_rows"]


def test_four_processes_tp_pp_and_dp_tp(dist_case):
    results = torchrun("inference_layouts.py", 4, dist_case)
    check_dist(results, ["tp2_pp2", "dp2_tp2"])
    stages = [r["stage_params"]["tp2_pp2"]["encoders"] for r in results]
    assert stages == [["0", "1"], ["0", "1"], ["2"], ["2"]]  # tp innermost, then pp
