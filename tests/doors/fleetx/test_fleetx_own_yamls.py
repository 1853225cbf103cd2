"""PaddleFleetX's own GPT YAMLs (tests/fixtures/fleetx, byte for byte): every file loads with
each FleetX key honoured or named as having no effect; the pretraining files run unmodified
through tools/train.py with ``-o`` overrides only for sizes, steps, device and data paths,
their multi-process layouts (dp, sharding, mp x pp) equal one process; and FleetX's
switches -- use_increments, recompute granularities, no_recompute_layers,
vocab_size_divisible_unit, Profiler, Compress / TensorRT -- do what they say."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
import torch
from engine_helpers import make_engine, run_tool
from fleetx_files import GPT_CONFIGS, TINY, fleetx_corpus, tokenizer_overrides
from log_lines import LogLines
from train_net_helpers import read_metrics

from libai import dist
from libai.fleetx import fleetx_keys
from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config
from libai.fleetx.yaml_setup import dist_config, recompute_spec, setup_yaml_run

ALL_FILES = sorted(GPT_CONFIGS.rglob("*.yaml"))
#: files that only serve as a ``_base_`` of others (no Model.module anywhere in their chain)
BASE_ONLY = {"finetune_gpt_base.yaml", "export_gpt_fp16_single_card.yaml"}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(GPT_CONFIGS)))
def test_every_fleetx_gpt_yaml_loads(path):
    if path.name in BASE_ONLY:
        with pytest.raises(YAMLConfigError, match="Model.module is required"):
            load_yaml_config(path)
        return
    cfg = load_yaml_config(path)
    assert cfg.Model.module
    spec = recompute_spec(cfg)
    assert spec.mode in ("full", "full_attn", "core_attn")
    d = dist_config(cfg)
    assert d["tensor_parallel_size"] == cfg.Distributed.mp_degree


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(GPT_CONFIGS)))
def test_every_fleetx_gpt_yaml_resolves_its_run_spec(path):
    """Past the key check: the batch sizes on the file's own process count and the whole run
    spec (mixed precision with FleetX's op lists, e.g. the generation files' ``where``, and
    ``level: null`` = O1 as FleetX's no-decorate)."""
    from libai.fleetx.yaml_config import resolve_batch_config
    from libai.fleetx.yaml_setup import amp_settings, train_namespace

    if path.name in BASE_ONLY:
        return
    cfg = load_yaml_config(path)
    d = cfg.Distributed
    world = (d.dp_degree or 1) * d.mp_degree * d.pp_degree * d.sharding.sharding_degree
    resolve_batch_config(cfg, world)
    enabled, _, lists = amp_settings(cfg, "train")
    spec = train_namespace(cfg, train_iter=10, steps_per_epoch=5, mode="train", has_eval=True)
    assert spec.amp.enabled == enabled == bool(cfg.Engine.mix_precision.enable)
    assert spec.amp.level == str(cfg.Engine.mix_precision.level or "O1").upper()
    if "where" in (cfg.Engine.mix_precision.custom_black_list or []):
        assert "where" in lists.black
    assert cfg.Global.global_batch_size % cfg.Global.micro_batch_size == 0


def test_the_keys_of_the_175b_file_mean_what_fleetx_says():
    """pretrain_gpt_175B_mp8_pp16.yaml: sequence parallel over mp, recompute of the attention
    core, vocab padded to 128 x mp, and ``1e-6``-style strings read as numbers."""
    cfg = load_yaml_config(GPT_CONFIGS / "pretrain_gpt_175B_mp8_pp16.yaml")
    d = dist_config(cfg)
    assert (d["tensor_parallel_size"], d["pipeline_parallel_size"]) == (8, 16)
    assert d["sequence_parallel"] is bool(cfg.Model.sequence_parallel)
    spec = recompute_spec(cfg)
    assert (spec.enabled, spec.mode) == (True, cfg.Model.recompute_granularity or "full")
    vpp = load_yaml_config(
        GPT_CONFIGS / "pretrain_gpt_175B_mp8_pp16.yaml", ["Model.virtual_pp_degree=2"]
    )
    assert dist_config(vpp)["virtual_pipeline_size"] == 2
    assert dist_config(vpp)["pipeline_schedule"] == "Interleaved1F1B"
    assert fleetx_keys.padded_vocab_size(50304, 128, 8) == 51200  # FleetX's rule
    assert fleetx_keys.padded_vocab_size(50257, 128, 1) == 50304
    finetune = load_yaml_config(GPT_CONFIGS / "finetune_gpt_345M_single_card_glue.yaml")
    assert finetune.Optimizer.epsilon == 1e-6  # "1e-6" in the file, a number in FleetX


def test_no_effect_keys_are_named_once_each(caplog):
    cfg = load_yaml_config(GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml")
    with caplog.at_level(logging.INFO, logger="libai.fleetx.fleetx_keys"):
        named = fleetx_keys.announce_no_effect_keys(cfg)
    assert {"Model.fuse_attn_qkv", "Model.scale_qk_by_layer_num"} <= set(named)
    for key in named:
        assert sum(f"key {key}=" in r.getMessage() for r in caplog.records) == 1
    assert cfg.Model.fused_linear is False and cfg.Optimizer.tensor_fusion is False
    assert not {"Model.fused_linear", "Optimizer.tensor_fusion"} & set(named)  # off: no line


@pytest.mark.parametrize("tuning", [False, True])
def test_a_switched_off_tuning_section_is_not_named_and_later_keys_still_are(tuning):
    """FleetX's ``Tuning`` section (auto-tuning of recompute) is named only when enabled;
    either way the keys checked after it (``Data.<split>.sample_split``) are still named."""
    cfg = load_yaml_config(
        GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
        [f"Tuning={{enable: {tuning}, tuning_recompute: true}}", "+Data.Train.sample_split=2"],
    )
    named = fleetx_keys.announce_no_effect_keys(cfg)
    assert "Data.Train.sample_split" in named
    assert ("Tuning" in named) is tuning


def test_compress_and_tensorrt_are_a_clear_error_only_when_on(tmp_path):
    qat = load_yaml_config(GPT_CONFIGS / "qat_gpt_345M_single_card.yaml")
    with pytest.raises(YAMLConfigError, match="Compress is enabled: quantization-aware"):
        fleetx_keys.check_unsupported(qat)
    off = load_yaml_config(
        GPT_CONFIGS / "qat_gpt_345M_single_card.yaml", ["Compress.Quantization.enable=False"]
    )
    fleetx_keys.check_unsupported(off)
    inference = load_yaml_config(
        GPT_CONFIGS / "inference_gpt_345M_single_card.yaml", ["Inference.TensorRT={precision:fp16}"]
    )
    fleetx_keys.check_unsupported(inference, "export")
    with pytest.raises(YAMLConfigError, match="Inference.TensorRT is set"):
        fleetx_keys.check_unsupported(inference, "inference")


# ---- a tiny GPT from FleetX's 345M file ----------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleetx_own")
    data = fleetx_corpus(root / "data", num_docs=300)
    return [
        *TINY,
        *tokenizer_overrides(root / "tok"),
        f"Data.Train.dataset.input_dir={data}",
        f"Data.Eval.dataset.input_dir={data}",
        "Data.Train.dataset.max_seq_len=16",
        "Data.Eval.dataset.max_seq_len=16",
        "Engine.logging_freq=1",
        "Engine.eval_freq=-1",
    ]


def test_use_increments_counts_the_cosine_schedule_in_samples(tiny, tmp_path):
    """FleetX's engine steps its schedule by the global batch size (``use_increments``), and
    its GPT module first turns ``decay_steps`` into samples (x global batch,
    ``process_optim_configs``): the LR after step k is FleetX's cosine formula
    (lr_scheduler.py) at k x global_batch_size samples with decay_steps x global_batch_size,
    computed here from FleetX's code."""
    cfg = load_yaml_config(
        GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
        [
            *tiny,
            "Optimizer.lr.decay_steps=10",
            "Optimizer.lr.warmup_rate=0.25",
            "Optimizer.lr.max_lr=1.0",
            "Optimizer.lr.min_lr=0.1",
            "Global.local_batch_size=4",
            "Global.micro_batch_size=2",
            f"Engine.save_load.output_dir={tmp_path}",
        ],
    )
    assert cfg.Optimizer.lr.use_increments is True  # the file's own setting
    engine = make_engine(cfg)
    gbs = cfg.Global.global_batch_size
    assert gbs == 4 and engine.cfg.Optimizer.lr.decay_steps == 10 * gbs
    decay, warmup = 10 * gbs, 0.25 * 10 * gbs  # in samples, as FleetX's scheduler sees them

    def fleetx_lr(t):
        if t <= warmup:
            return 1.0 * t / warmup
        if t > decay:
            return 0.1
        ratio = (t - warmup) / (decay - warmup)
        return 0.1 + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (1.0 - 0.1)

    seen = []
    for k in range(14):
        seen.append(engine.optimizer.param_groups[0]["lr"])
        assert seen[-1] == pytest.approx(fleetx_lr(k * gbs)), k
        engine.lr_scheduler.step()
    assert seen[2] == pytest.approx(0.8)  # warmup over 2.5 steps: 2 / 2.5
    assert seen[12] == pytest.approx(0.1)  # decayed after 10 steps


def _saved_bytes(model, batch) -> int:
    """Bytes autograd keeps for backward in one forward (saved-tensor hooks)."""
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch)["lm_loss"]
    loss.backward()
    return sum(seen.values())


def test_recompute_granularities_keep_gradients_and_save_less(tiny, tmp_path):
    """full / full_attn / core_attn and no_recompute_layers from the YAML: the gradients
    equal the run without recompute; full_attn keeps less than core_attn, which keeps less
    than no recompute; skipping layer 0 keeps more than recomputing it."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 300, (2, 17), generator=g)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    results = {}
    for name, extra in {
        "none": ["Model.use_recompute=False"],
        "full": ["Model.recompute_granularity=full"],
        "full_attn": ["Model.recompute_granularity=full_attn"],
        "core_attn": ["Model.recompute_granularity=core_attn"],
        "full_skip0": ["Model.recompute_granularity=full", "Model.no_recompute_layers=[0]"],
    }.items():
        cfg = load_yaml_config(
            GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
            [*tiny, "Model.use_recompute=True", *extra, f"Engine.save_load.output_dir={tmp_path}"],
        )
        engine = make_engine(cfg)
        model = engine.runner.model
        model.train()
        saved = _saved_bytes(model, batch)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[name] = (saved, grads)
    none_saved, none_grads = results["none"]
    for name, (_, grads) in results.items():
        for n, g_ in grads.items():
            torch.testing.assert_close(g_, none_grads[n], rtol=1e-5, atol=1e-6, msg=f"{name} {n}")
    saved = {name: r[0] for name, r in results.items()}
    assert saved["full"] < saved["full_attn"] < saved["core_attn"] < saved["none"], saved
    assert saved["full"] < saved["full_skip0"] < saved["none"], saved


def test_profiler_writes_a_trace_of_the_profiled_steps(tiny, tmp_path):
    cfg = load_yaml_config(
        GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
        [
            *tiny,
            "Engine.max_steps=4",
            "Profiler.enable=True",
            "Profiler.scheduler=[1,3]",
            f"Engine.save_load.output_dir={tmp_path}",
        ],
    )
    engine = make_engine(cfg)
    with LogLines("libai.fleetx.profiler") as messages:
        engine.fit()
    trace = tmp_path / "profiler_log" / "trace_rank0.json"
    # rank 0 logs torch's operator table of the profiled steps (15 rows, not detailed)
    (summary,) = [m for m in messages if m.startswith("Profiler: steps [1, 3), trace ")]
    table = summary.split("\n")[1:]
    assert table[1].split()[:3] == ["Name", "Self", "CPU"]
    rows = [line for line in table[3:] if line and not line.startswith(("-", "Self CPU time"))]
    self_cpu = [float(re.search(r"\s(\d+\.\d+)%", row).group(1)) for row in rows]
    assert len(rows) == 15 and self_cpu == sorted(self_cpu, reverse=True)  # by self CPU time
    assert any(row.split()[0] == "ProfilerStep*" for row in rows)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert any(n in names for n in ("aten::mm", "aten::addmm", "aten::linear"))
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#1", "ProfilerStep#2"}


# ---- FleetX's pretraining files, unmodified, on 1, 2 and 4 processes ------------------------
RUN = [
    "Engine.max_steps=3",
    "Engine.save_load.save_steps=-1",
    "Global.global_batch_size=4",
    "Global.local_batch_size=null",
    "Global.micro_batch_size=null",
    "Engine.mix_precision.enable=false",  # CPU: fp32 numbers for the comparison
]


def _losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


def test_fleetx_pretrain_files_run_unmodified_and_layouts_equal_one_process(tiny, tmp_path):
    """345M single card on 1 process; 1.3B dp8 as dp2, 6.7B sharding16 as ZeRO-2 over 2,
    175B mp8 x pp16 as mp2 x pp2 on 4 -- FleetX's files with sizes shrunk -- give the
    losses of the one-process run on the same global batches."""
    tiny = [o for o in tiny if not o.startswith(("Global.local_batch_size", "Global.micro"))]
    size = [
        "Model.vocab_size=512",
        "Model.hidden_size=32",
        "Model.num_layers=2",
        "Model.num_attention_heads=2",
        "Model.ffn_hidden_size=64",
        "Model.max_position_embeddings=64",
    ]
    base = [*tiny, *size, *RUN]
    one = tmp_path / "one"
    run_tool(
        "train",
        GPT_CONFIGS / "pretrain_gpt_345M_single_card.yaml",
        *base,
        f"Engine.save_load.output_dir={one}",
    )
    want = _losses(one)
    assert len(want) == 3
    runs = {
        "pretrain_gpt_1.3B_dp8.yaml": (2, ["Distributed.dp_degree=2"]),
        "pretrain_gpt_6.7B_sharding16.yaml": (2, ["Distributed.sharding.sharding_degree=2"]),
        "pretrain_gpt_175B_mp8_pp16.yaml": (
            4,
            ["Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.micro_batch_size=1"],
        ),
    }
    for name, (nproc, layout) in runs.items():
        out = tmp_path / name
        run_tool(
            "train",
            GPT_CONFIGS / name,
            *base,
            *layout,
            f"Engine.save_load.output_dir={out}",
            nproc=nproc,
            timeout=600,
        )
        assert _losses(out) == pytest.approx(want, rel=1e-4), name


@pytest.fixture(autouse=True)
def _single_process_mesh():
    yield
    if dist.get_dist_util() is not None:
        pass


def test_setup_names_the_no_effect_keys_and_rejects_enabled_compress(tiny, tmp_path, caplog):
    cfg = load_yaml_config(
        GPT_CONFIGS / "qat_gpt_345M_single_card.yaml",
        [*tiny, f"Engine.save_load.output_dir={tmp_path}"],
    )
    with pytest.raises(YAMLConfigError, match="Compress is enabled"):
        setup_yaml_run(cfg)
