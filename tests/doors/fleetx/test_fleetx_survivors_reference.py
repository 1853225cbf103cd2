"""FleetX front-door behaviours pinned against references worked out here: the run length
of ``Engine.fit(epoch=N)`` (epochs x steps per epoch), GeneralClsModule's default TopkAcc
(top-1 / top-5 by hand), GPTEvalModule's cloze counts on an empty LAMBADA file (0 of 0),
LlamaSFTModule's tokenizer from ``Model.pretrained`` (transformers' AutoTokenizer on the
same directory) and its export input range (the checkpoint's vocabulary), and the list of
optimizer names an unknown ``Optimizer.name`` error offers (torch.optim's concrete
classes)."""

from __future__ import annotations

import math
import re
import shutil

import pytest
import torch
import transformers
from engine_helpers import ROOT, make_engine, simple_cfg
from fleetx_files import GPT_CONFIGS, TINY, tiny_hf_gpt2, tokenizer_overrides
from fleetx_reference import FLEETX
from train_net_helpers import read_metrics
from zoo_data import build_sft_files

from libai.fleetx.yaml_config import load_yaml_config
from libai.fleetx.yaml_optim import build_yaml_optimizer
from libai.fleetx.yaml_setup import build_module, setup_yaml_run

VIT_YAML = FLEETX / "ppfleetx/configs/vis/vit/ViT_base_patch16_224_pt_in1k_2n16c_dp_fp16o2.yaml"


def test_fit_with_an_explicit_epoch_count_runs_epochs_times_steps_per_epoch(tmp_path):
    """``fit(epoch=3)`` on 32 samples, global batch 16, no max_steps: 3 x (32 // 16) = 6
    steps (not Engine.num_train_epochs=4, which would give 8)."""
    engine = make_engine(simple_cfg(tmp_path, "Engine.max_steps=-1", "Engine.num_train_epochs=4"))
    steps_per_epoch = 32 // 16
    expected = 3 * steps_per_epoch
    engine.fit(epoch=3)
    assert engine.trainer.max_iter == expected
    assert engine.trainer.iter == expected
    assert sorted(read_metrics(tmp_path)) == list(range(expected))


def _vit_module(tmp_path, metric: str | list[str], class_num: str):
    """GeneralClsModule of FleetX's ViT YAML, shrunk to a 1-block ViT on 16 x 16 images;
    ``metric``: the override(s) of its Model.metric section."""
    cfg = load_yaml_config(
        VIT_YAML,
        [
            *([metric] if isinstance(metric, str) else metric),
            "Global.device=cpu",
            "Global.local_batch_size=4",
            "Global.micro_batch_size=4",
            "Engine.mix_precision.enable=false",
            "Model.model.name=ViT_tiny_patch8_16",
            f"Model.model.class_num={class_num}",
            "Model.model.drop_rate=0.0",
            "+Model.model.embed_dim=16",
            "+Model.model.depth=1",
            "+Model.model.num_heads=2",
            f"Engine.save_load.output_dir={tmp_path}",
        ],
    )
    setup_yaml_run(cfg, "eval")
    return cfg, build_module(cfg)


def _topk_by_hand(module, seed: int) -> tuple[dict, dict]:
    """The module's validation result on 12 random images of 7 classes, and for each k of
    its topk the fraction whose label is among the first k of torch.argsort of the logits."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(12, 3, 16, 16, generator=g)
    labels = torch.randint(0, 7, (12,), generator=g)
    module.model.eval()
    with torch.no_grad():
        out = module.validation_step({"images": images, "labels": labels})
        logits = module.model(images)["logits"]
    assert logits.shape == (12, 7)
    order = torch.argsort(logits, dim=-1, descending=True)
    want = {
        f"top{k}": sum(int(labels[i] in order[i, :k].tolist()) for i in range(12)) / 12
        for k in module.topk
    }
    result = module.validation_epoch_end({"sums": {k: v for k, v in out.items() if k != "loss"}})
    return {k: float(v) for k, v in result.items()}, want


def test_general_cls_without_a_metric_section_reports_top1_and_top5(tmp_path):
    """No ``Model.metric`` in FleetX's ViT YAML: the documented default TopkAcc with topk
    [1, 5]; validation_step + validation_epoch_end give the fractions of samples whose label
    is in torch.topk's first 1 / 5 classes, counted here by hand."""
    cfg, module = _vit_module(tmp_path, "~Model.metric", "7")
    assert "metric" not in cfg.Model and module.topk == [1, 5]
    result, want = _topk_by_hand(module, seed=0)
    assert 0 < want["top5"] and want["top1"] < 1  # a reference with hits and misses
    assert result == pytest.approx(want)


def test_general_cls_reads_its_metric_section_and_resolves_interpolations(tmp_path, monkeypatch):
    """``Model.metric.eval.topk: [1, 3]`` gives top-1 and top-3 (by hand, as above); a value
    written as an OmegaConf interpolation (the class count from an environment variable) is
    resolved before the model is built."""
    monkeypatch.setenv("LIBAI_TEST_CLASS_NUM", "7")
    interpolated = "'${oc.decode:${oc.env:LIBAI_TEST_CLASS_NUM}}'"
    _, module = _vit_module(tmp_path, "Model.metric.eval.topk=[1,3]", interpolated)
    assert module.topk == [1, 3]
    result, want = _topk_by_hand(module, seed=1)
    assert 0 < want["top3"] < 1
    assert set(result) == {"top1", "top3"} and result == pytest.approx(want)


def test_gpt_eval_cloze_on_an_empty_file_counts_zero_of_zero(tmp_path):
    """LAMBADA accuracy (cloze_eval) of a file with no examples: 0 correct of 0 examples,
    accuracy NaN (nothing to divide), as the counts' definitions give (Engine.evaluate)."""
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("")
    tiny_hf_gpt2(tmp_path / "hf")
    cfg = load_yaml_config(
        GPT_CONFIGS / "eval_gpt_345M_single_card.yaml",
        [
            *TINY,
            *tokenizer_overrides(tmp_path / "tok"),
            f"+Model.pretrained={tmp_path / 'hf'}",
            f"Engine.save_load.output_dir={tmp_path / 'out'}",
            f"Offline_Eval.eval_path={path}",
            "Offline_Eval.cloze_eval=true",
            "Offline_Eval.max_seq_len=16",
            "Offline_Eval.batch_size=2",
        ],
    )
    result = make_engine(cfg, mode="eval").evaluate()
    assert result["num_correct"] == 0
    assert result["num_examples"] == 0
    assert math.isnan(result["acc"])


@pytest.fixture(scope="module")
def llama_from_pretrained(tmp_path_factory):
    """A tiny Hugging Face Llama saved with its tokenizer files, and LlamaSFTModule built
    from configs/fleetx/llama_sft.yaml with only Model.pretrained set (no Model.tokenizer)."""
    root = tmp_path_factory.mktemp("llama_pretrained")
    tok_dir, data, vocab = build_sft_files(root)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab + 5,
        max_position_embeddings=64,
    )
    hf_dir = root / "hf"
    transformers.LlamaForCausalLM(config).save_pretrained(hf_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, hf_dir / name)
    cfg = load_yaml_config(
        ROOT / "configs" / "fleetx" / "llama_sft.yaml",
        [
            f"Model.pretrained={hf_dir}",
            f"Data.Train.dataset.data_path={data}",
            f"Engine.save_load.output_dir={root / 'out'}",
            "~Model.hidden_layers",
            "~Model.hidden_size",
            "~Model.intermediate_size",
            "~Model.num_attention_heads",
            "~Model.num_key_value_heads",
            "~Model.max_position_embeddings",
        ],
    )
    assert cfg.Model.tokenizer is None
    setup_yaml_run(cfg, "train")
    return build_module(cfg), hf_dir, vocab + 5


def test_llama_sft_tokenizer_comes_from_model_pretrained(llama_from_pretrained):
    """Model.tokenizer unset: the tokenizer is the pretrained directory's, encoding as
    transformers' AutoTokenizer loaded from that directory."""
    module, hf_dir, _ = llama_from_pretrained
    reference = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    for text in ("Add 3 and 4.", "7"):
        want = reference.encode(text, add_special_tokens=False)
        assert module.tokenizer.encode(text, add_special_tokens=False) == want


def test_llama_sft_export_inputs_span_the_checkpoint_vocabulary(llama_from_pretrained):
    """input_spec: int64 token ids drawn from [0, vocab) with vocab the checkpoint's
    config.json vocab_size (InputSpec.high), not InputSpec's default of 2."""
    module, _, vocab = llama_from_pretrained
    (spec,) = module.input_spec()
    assert (spec.name, str(spec.dtype), spec.high) == ("input_ids", "int64", vocab)


def test_unknown_optimizer_name_lists_torch_optimizers_but_not_the_base_class():
    """An unknown Optimizer.name: the error's "Known:" list is torch.optim's concrete
    optimizer classes (worked out here from torch.optim), without the abstract base
    ``Optimizer``."""
    concrete = sorted(
        n
        for n, c in vars(torch.optim).items()
        if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
        and c is not torch.optim.Optimizer
    )  # fmt: skip
    assert {"AdamW", "SGD"} <= set(concrete)
    with pytest.raises(ValueError, match="Optimizer.name: unknown name 'AdamWW'") as info:
        build_yaml_optimizer({"name": "AdamWW", "lr": 0.1}, torch.nn.Linear(2, 2))
    known = re.search(r"Known: (.*), or give a dotted", str(info.value)).group(1).split(", ")
    assert known == concrete
    assert "Optimizer" not in known
