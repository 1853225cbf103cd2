"""Options of the FleetX zoo modules pinned against references worked out here: LlamaSFT's
``Model.vocab_size`` written in the YAML (kept, not the tokenizer's padded size) and its log's
``tokens_per_sec`` (the batch's token count over the step's ``train_cost``), a single
``Model.metric.eval.topk`` number (GeneralCls: top-k by hand), ViT's export input (the
dtype and shape of the images its data loader yields), and the key ERNIE's tokenizer error
names by default."""

from __future__ import annotations

import time

import pytest
import torch
from engine_helpers import ROOT, make_engine
from test_fleetx_survivors_reference import _topk_by_hand, _vit_module
from zoo_data import build_image_folder, build_sft_files

from libai.fleetx.yaml_config import load_yaml_config
from libai.fleetx.yaml_setup import build_module, setup_yaml_run

CONFIGS = ROOT / "configs" / "fleetx"
LLAMA_SHAPE = [
    "Model.hidden_layers=1",
    "Model.hidden_size=32",
    "Model.intermediate_size=64",
    "Model.num_attention_heads=4",
    "Model.num_key_value_heads=2",
    "Model.max_position_embeddings=128",
]


def _llama_sft_cfg(root, *overrides):
    root.mkdir(parents=True, exist_ok=True)
    tok_dir, data, vocab = build_sft_files(root)
    cfg = load_yaml_config(
        CONFIGS / "llama_sft.yaml",
        [
            f"Model.tokenizer={tok_dir}",
            f"Data.Train.dataset.data_path={data}",
            "Data.Train.dataset.max_seq_length=48",
            f"Engine.save_load.output_dir={root / 'out'}",
            *LLAMA_SHAPE,
            *overrides,
        ],
    )
    return cfg, vocab


def test_llama_sft_keeps_a_vocab_size_written_in_the_yaml(tmp_path):
    """``Model.vocab_size: 300`` for a model from scratch: the embedding has 300 rows, not
    the tokenizer's vocabulary padded to a multiple of 128 (the default without the key)."""
    cfg, vocab = _llama_sft_cfg(tmp_path / "given", "+Model.vocab_size=300")
    padded = -(-vocab // 128) * 128
    assert padded != 300
    setup_yaml_run(cfg, "train")
    module = build_module(cfg)
    assert module.model.model.embed_tokens.num_embeddings == 300
    cfg, _ = _llama_sft_cfg(tmp_path / "default")
    setup_yaml_run(cfg, "train")
    assert build_module(cfg).model.model.embed_tokens.num_embeddings == padded


def test_llama_sft_log_gives_tokens_per_second(tmp_path):
    """Each step's log dict (logging_freq 1, one micro-batch of 2 per step): tokens_per_sec
    x train_cost is the token count of the step's batch, counted from the data loader; the
    costs (steps' and the epoch's) are wall times within the fit's."""
    cfg, _ = _llama_sft_cfg(
        tmp_path,
        "Global.global_batch_size=2",
        "Global.micro_batch_size=2",
        "Engine.max_steps=2",
        "Engine.logging_freq=1",
    )
    engine = make_engine(cfg)
    logs, epochs = [], []
    engine.module.training_step_end = logs.append
    engine.module.training_epoch_end = epochs.append
    tokens = [batch["input_ids"].numel() for _, batch in zip(range(2), engine.train_loader)]
    start = time.perf_counter()
    engine.fit()
    elapsed = time.perf_counter() - start
    assert len(logs) == 2 and tokens[0] > 2
    for log, count in zip(logs, tokens):
        assert 0 < log["train_cost"] < elapsed
        assert log["tokens_per_sec"] * log["train_cost"] == pytest.approx(count, rel=1e-9)
    # the epoch's train_cost: its wall time, within the fit's
    assert epochs and 0 < sum(e["train_cost"] for e in epochs) < elapsed


def test_general_cls_takes_a_single_topk_number(tmp_path):
    """``Model.metric.eval.topk: 3`` (a number, not a list, as FleetX's TopkAcc takes):
    top-3 alone, by hand."""
    metric = ["~Model.metric", "+Model.metric.eval.name=TopkAcc", "+Model.metric.eval.topk=3"]
    cfg, module = _vit_module(tmp_path, metric, "7")
    assert cfg.Model.metric.eval.topk == 3
    assert module.topk == [3]
    result, want = _topk_by_hand(module, seed=2)
    assert set(result) == {"top3"} and result == pytest.approx(want)


def test_vit_export_input_matches_its_images(tmp_path):
    """ImageClassificationModule.input_spec: one float32 ``images`` input of the shape the
    configured data loader yields (channels, height, width), any batch size."""
    root = build_image_folder(tmp_path / "images")
    cfg = load_yaml_config(
        CONFIGS / "vit_classification.yaml",
        [
            f"Engine.save_load.output_dir={tmp_path / 'run'}",
            f"Data.Train.dataset.root={root / 'train'}",
            f"Data.Eval.dataset.root={root / 'val'}",
            "Model.img_size=16",
            "Model.patch_size=4",
            "Model.embed_dim=32",
            "Model.depth=1",
            "Model.num_heads=4",
            "Model.num_classes=3",
            "Global.global_batch_size=6",
            "Global.micro_batch_size=6",
        ],
    )
    engine = make_engine(cfg)
    images = next(iter(engine.train_loader))["images"]
    (spec,) = engine.module.input_spec()
    assert spec.name == "images" and spec.torch_dtype == images.dtype == torch.float32
    assert list(spec.shape) == [None, *images.shape[1:]]


def test_ernie_tokenizer_error_names_fleetx_key_by_default(tmp_path):
    """A vocabulary path that is not a file: the error names FleetX's key for it,
    ``Data.Train.dataset.tokenizer_type``, with its -o override."""
    from libai.fleetx.modules.ernie import ernie_tokenizer

    missing = tmp_path / "no_vocab.txt"
    with pytest.raises(ValueError) as info:
        ernie_tokenizer(str(missing))
    message = str(info.value)
    assert message.startswith(f"Data.Train.dataset.tokenizer_type={str(missing)!r}")
    assert "-o Data.Train.dataset.tokenizer_type=/path/to/vocab.txt" in message
