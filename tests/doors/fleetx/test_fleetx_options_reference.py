"""FleetX door options pinned against FleetX's rules (written out here) or the library that
does the work: the loader section's arguments as torch's ``DataLoader`` holds them, a
collator mapping's ``name`` (FleetX's builder needs it), ``OnnxPredictor``'s positions for a
graph without a mask, the ``Generation`` section's default strategy (FleetX's ``sampling``),
the optimizer when ``Optimizer.name`` is absent (AdamW, as documented), and the keys named by
the errors of ``Profiler.scheduler`` and of null parallel degrees."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
from engine_helpers import simple_cfg
from fleetx_reference import LANGUAGE_MODULE, fleetx_function
from omegaconf import OmegaConf

from libai.fleetx.export import OnnxPredictor
from libai.fleetx.modules.gpt_generation import generation_config
from libai.fleetx.profiler import profiler_hook
from libai.fleetx.yaml_config import YAMLConfigError, resolve_batch_config
from libai.fleetx.yaml_loaders import build_split_loader
from libai.fleetx.yaml_optim import build_yaml_optimizer
from libai.fleetx.yaml_setup import yaml_argument_parser

DATASET = {
    "name": "projects.simple_net.dataset.RandomDataset",
    "num_samples": 8,
    "image_size": 4,
    "class_num": 3,
}


def _loader(**loader):
    section = OmegaConf.create({"dataset": DATASET, "loader": loader})
    return build_split_loader(section, "Eval", batch_size=2, seed=0)


def test_loader_section_reaches_the_torch_dataloader():
    """``Data.<split>.loader``'s workers, timeout, prefetch and pinning are torch's
    ``DataLoader`` arguments: the loader holds the values given (torch's defaults: 0 s,
    2 batches, no pinning)."""
    loader = _loader(num_workers=1, timeout=7, prefetch_factor=3, pin_memory=True)
    assert (loader.num_workers, loader.timeout, loader.prefetch_factor) == (1, 7, 3)
    assert loader.pin_memory is True and loader.persistent_workers is True
    loader = _loader()
    assert (loader.num_workers, loader.timeout, loader.pin_memory) == (0, 0, False)


def test_collate_fn_mapping_needs_its_name_and_functions_take_no_arguments():
    """FleetX's ``collate_fn: {name: ErnieCollateData, <arguments>}`` builds ``name`` with the
    arguments (FleetX's builder pops ``name``, so a mapping without one fails there too); a
    collate function takes the batch, so arguments for it are an error, not dropped."""
    with pytest.raises(ValueError, match=r"collate_fn is a mapping without a name: set Data\.Eval"):
        _loader(collate_fn={"micro_batch_size": 2})
    with pytest.raises(ValueError, match=r"collate_fn\.x: default is a function of the batch"):
        _loader(collate_fn={"name": "default", "x": 1})
    batch = next(iter(_loader(collate_fn={"name": "default"})))
    assert isinstance(batch, list) and len(batch) == 2  # the trivial collator: the samples
    # a collator class's arguments are checked against its signature, the key named in full
    with pytest.raises(
        ValueError,
        match=r"unknown config key Data\.Eval\.loader\.collate_fn\.micro_batch; did you mean "
        r"Data\.Eval\.loader\.collate_fn\.micro_batch_size\? \(ErnieCollateData takes",
    ):
        _loader(collate_fn={"name": "ErnieCollateData", "micro_batch": 2})


def test_onnx_predictor_fills_positions_for_a_graph_without_a_mask(tmp_path):
    """A graph that takes ``input_ids`` and ``position_ids`` but no ``attention_mask`` (a
    module's own input spec): a batch of ids alone gets the positions of an all-ones mask,
    0 .. seq - 1 on every row."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "position_ids")
    ]
    outputs = [helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "seq"])]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["position_ids"], ["positions"])], "g", inputs, outputs
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "rank_0").mkdir()
    onnx.save(model, str(tmp_path / "rank_0" / "model.onnx"))
    ids = torch.randint(0, 50, (3, 5))
    got = OnnxPredictor(str(tmp_path))({"input_ids": ids, "labels": ids})["positions"]
    np.testing.assert_array_equal(got, np.tile(np.arange(5), (3, 1)))


def test_onnx_predictor_keeps_a_given_mask_and_derives_positions_from_it(tmp_path):
    """A causal-LM graph taking ids, mask and positions: a left-padded batch's own mask goes
    in unchanged, and the positions missing from the batch count its real tokens from 0
    (``cumsum(mask) - 1``, padding at 0), as transformers' GPT-2 derives them; a batch
    without a mask gets an all-ones one."""
    import onnx
    from onnx import TensorProto, helper

    names = ("input_ids", "attention_mask", "position_ids")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in names]
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("m", "p")]
    nodes = [
        helper.make_node("Identity", ["attention_mask"], ["m"]),
        helper.make_node("Identity", ["position_ids"], ["p"]),
    ]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "rank_0").mkdir()
    onnx.save(model, str(tmp_path / "rank_0" / "model.onnx"))
    predictor = OnnxPredictor(str(tmp_path))
    ids = torch.randint(0, 50, (2, 4))
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = predictor({"input_ids": ids, "attention_mask": mask})
    np.testing.assert_array_equal(out["m"], mask.numpy())
    np.testing.assert_array_equal(out["p"], [[0, 0, 0, 1], [0, 1, 2, 3]])
    out = predictor({"input_ids": ids})
    np.testing.assert_array_equal(out["m"], np.ones((2, 4)))
    np.testing.assert_array_equal(out["p"], np.tile(np.arange(4), (2, 1)))


def test_generation_max_dec_len_follows_fleetx_adjust_length_to_model():
    """``max_dec_len``: FleetX's own ``adjust_length_to_model(length, 512)`` (compiled from
    the unmodified language_module.py among the fixtures) for every length, 0 included."""
    method = fleetx_function(LANGUAGE_MODULE, "GPTGenerationModule", "adjust_length_to_model")
    for length in (-7, -1, 0, 1, 20, 511, 512, 513, 4096):
        section = OmegaConf.create({"max_dec_len": length})
        config = generation_config(section, eos_token_id=0, seed=1)
        assert config.max_new_tokens == method(None, length, 512), length


@pytest.mark.parametrize(
    ("strategy", "beams", "sample"),
    [("beam_search", 3, False), ("greedy_search", 1, False), ("sampling", 1, True)],
)
def test_generation_num_beams_counts_in_beam_search_only(strategy, beams, sample):
    """``num_beams: 3`` is beam search's width; greedy search and sampling run one beam, as
    FleetX's strategies do."""
    section = OmegaConf.create({"decode_strategy": strategy, "num_beams": 3})
    config = generation_config(section, eos_token_id=0, seed=1)
    assert (config.num_beams, config.do_sample) == (beams, sample)


def test_generation_length_penalty_zero_ranks_beams_by_their_summed_log_probs():
    """FleetX reads ``length_penalty`` with 0.0 as its default, PaddleNLP's beam score being
    ``sum_logprobs / ((len + 5) / 6) ** length_penalty``: at 0.0 the plain sum. Our beam
    search scores ``sum_logprobs / len ** length_penalty`` (transformers'), so the config must
    keep 0.0 for the same ranking of hypotheses (sum, generated length); other values pass."""

    def paddle_score(total, length, penalty):
        return total / (((length + 5) / 6) ** penalty)

    hypotheses = [(-2.0, 2), (-2.5, 5), (-0.4, 1), (-3.0, 9), (-1.2, 3)]
    want = sorted(hypotheses, key=lambda h: paddle_score(*h, 0.0))
    for given in ({}, {"length_penalty": 0.0}):
        section = OmegaConf.create({"decode_strategy": "beam_search", "num_beams": 2, **given})
        penalty = generation_config(section, eos_token_id=0, seed=1).length_penalty
        assert sorted(hypotheses, key=lambda h: h[0] / h[1] ** penalty) == want, given
    section = OmegaConf.create({"decode_strategy": "beam_search", "length_penalty": 1.5})
    assert generation_config(section, eos_token_id=0, seed=1).length_penalty == 1.5


def test_generation_eos_and_pad_are_the_sections_else_the_tokenizers_eos():
    """FleetX's GPT reads ``Generation.eos_token_id`` / ``pad_token_id``; when they are
    absent generation stops at and pads with the tokenizer's eos."""
    given = OmegaConf.create({"eos_token_id": 5, "pad_token_id": 7})
    config = generation_config(given, eos_token_id=0, seed=1)
    assert (config.eos_token_id, config.pad_token_id) == (5, 7)
    config = generation_config(OmegaConf.create({}), eos_token_id=3, seed=1)
    assert (config.eos_token_id, config.pad_token_id) == (3, 3)


def test_generation_without_a_decode_strategy_samples():
    """FleetX's GPT generation module reads ``decode_strategy`` with ``sampling`` as its
    default: sampling, one beam; ``greedy_search`` turns sampling off."""
    config = generation_config(OmegaConf.create({"top_p": 0.9}), eos_token_id=0, seed=1)
    assert config.do_sample is True and config.num_beams == 1 and config.top_p == 0.9
    greedy = OmegaConf.create({"decode_strategy": "greedy_search"})
    assert generation_config(greedy, eos_token_id=0, seed=1).do_sample is False


@pytest.mark.parametrize(
    ("name", "hint"),
    [("AdamWW", r"; did you mean AdamW( or \w+)*\?"), ("Zzqx", "")],
    ids=["close", "far"],
)
def test_an_unknown_name_suggests_only_close_ones(name, hint):
    """``difflib``'s close matches are offered when there are some; otherwise the message
    goes straight on to the known names."""
    with pytest.raises(ValueError) as info:
        build_yaml_optimizer({"name": name, "lr": 0.1}, torch.nn.Linear(2, 2))
    assert re.search(f"Optimizer.name: unknown name '{name}'{hint} Known: ", str(info.value))


def test_optimizer_without_a_name_is_adamw():
    """``Optimizer.name`` absent: torch's AdamW (docs/integrate_a_model.md), with the
    section's betas and epsilon."""
    model = torch.nn.Linear(3, 2)
    section = OmegaConf.create({"weight_decay": 0.01, "beta1": 0.8, "epsilon": 1e-7, "lr": 0.5})
    optimizer = build_yaml_optimizer(section, model)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["betas"] == (0.8, 0.999) and optimizer.defaults["eps"] == 1e-7
    assert optimizer.defaults["lr"] == 0.5
    # one beta given: the other is the default Paddle's AdamW and torch's share (0.9, 0.999)
    torch_betas = inspect.signature(torch.optim.AdamW).parameters["betas"].default
    for given, want in (({"beta2": 0.95}, (torch_betas[0], 0.95)), ({}, torch_betas)):
        section = OmegaConf.create({"name": "AdamW", "lr": 0.5, **given})
        assert build_yaml_optimizer(section, model).defaults["betas"] == want


def test_grad_clip_takes_global_norm_clipping_only():
    """``Optimizer.grad_clip``: FleetX's ``ClipGradByGlobalNorm`` (its name may be left out;
    its MoE files' ``ClipGradForMOEByGlobalNorm`` is the same norm here) stores the norm in
    every group; Paddle's other clippers are refused by name."""
    model = torch.nn.Linear(3, 2)
    moe = {"name": "ClipGradForMOEByGlobalNorm", "clip_norm": 1.5}
    for clip in ({"name": "ClipGradByGlobalNorm", "clip_norm": 1.5}, {"clip_norm": 1.5}, moe):
        section = OmegaConf.create({"lr": 0.5, "grad_clip": clip})
        groups = build_yaml_optimizer(section, model).param_groups
        assert {(g["clip_grad_max_norm"], g["clip_grad_norm_type"]) for g in groups} == {(1.5, 2)}
    for name in ("ClipGradByNorm", "ClipGradByValue"):
        section = OmegaConf.create({"lr": 0.5, "grad_clip": {"name": name, "clip_norm": 1.0}})
        with pytest.raises(
            YAMLConfigError,
            match=f"grad_clip.name='{name}': ClipGradByGlobalNorm .* is supported",
        ):
            build_yaml_optimizer(section, model)


def test_profiler_scheduler_error_names_the_key(tmp_path):
    for bad in ([3, 1], [1], [-1, 2]):
        cfg = OmegaConf.create(
            {
                "Profiler": {"enable": True, "scheduler": bad},
                "Engine": {"save_load": {"output_dir": str(tmp_path)}},
            }
        )
        with pytest.raises(ValueError, match=r"^Profiler\.scheduler must be \[start, end\)"):
            profiler_hook(cfg)


@pytest.mark.parametrize("key", ["mp_degree", "pp_degree", "sharding.sharding_degree"])
def test_null_model_parallel_degrees_are_refused_naming_the_key(tmp_path, key):
    """FleetX's degrees default to 1 in its base files; a null one (``dp_degree`` aside,
    which is derived) is refused with the key, before any process group exists."""
    with pytest.raises(YAMLConfigError, match=rf"Distributed\.{key} must be a positive integer"):
        resolve_batch_config(simple_cfg(tmp_path, f"Distributed.{key}=null"), 1)


@pytest.mark.parametrize(
    ("glob", "local", "ok"), [(16, 8, True), (16, None, True), (16, 16, False), (8, 16, False)]
)
def test_global_batch_is_local_batch_times_the_data_ranks(tmp_path, glob, local, ok):
    """Two processes, dp 2: ``global_batch_size = local_batch_size x 2``; a pair that does
    not multiply out is refused with both numbers."""
    overrides = [f"Global.global_batch_size={glob}", f"Global.local_batch_size={local or 'null'}"]
    cfg = simple_cfg(tmp_path, *overrides, "Global.micro_batch_size=null")
    if not ok:
        with pytest.raises(YAMLConfigError, match=rf"global_batch_size {glob} != local_batch_size"):
            resolve_batch_config(cfg, 2)
        return
    resolve_batch_config(cfg, 2)
    assert (cfg.Distributed.dp_degree, cfg.Global.local_batch_size) == (2, glob // 2)


@pytest.mark.parametrize("key", ["optimizer", "last_epoch"])
def test_a_schedulers_engine_set_arguments_are_refused_in_the_yaml(key):
    """``optimizer`` and ``last_epoch`` of a libai scheduler are the Engine's to set."""
    from libai.fleetx.yaml_optim import build_yaml_lr_scheduler

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    section = {"lr": {"name": "WarmupCosineLR", "learning_rate": 0.1, key: 1}}
    with pytest.raises(ValueError, match=rf"Optimizer.lr.{key} is set by the Engine"):
        build_yaml_lr_scheduler(section, optimizer, 10)


def test_tool_command_line_without_overrides_has_none():
    """FleetX's documented ``python tools/train.py -c <yaml>`` (no ``-o``): no overrides, an
    empty list the tools unpack; ``-o`` repeats and bare ``KEY=VALUE`` words add more."""
    parser = yaml_argument_parser("train")
    args = parser.parse_args(["-c", "pretrain_gpt_345M_single_card.yaml"])
    assert args.config == "pretrain_gpt_345M_single_card.yaml"
    assert [*args.override, *args.opts] == []
    args = parser.parse_args(["-c", "x.yaml", "-o", "A=1", "-o", "B=2", "C=3"])
    assert (args.override, args.opts) == (["A=1", "B=2"], ["C=3"])


def test_test_iters_default_to_ten_eval_iters(tmp_path):
    """FleetX's rule (ppfleetx/utils/config.py): an unset ``Engine.test_iters`` is
    ``eval_iters * 10``; a given one is kept."""
    cfg = simple_cfg(tmp_path, "Engine.eval_iters=7", "Engine.test_iters=null")
    assert resolve_batch_config(cfg, 1).Engine.test_iters == 70
    cfg = simple_cfg(tmp_path, "Engine.eval_iters=7", "Engine.test_iters=3")
    assert resolve_batch_config(cfg, 1).Engine.test_iters == 3


def test_profiler_log_directory_is_the_configured_one(tmp_path):
    """``Profiler.profiler_log``: a relative name lives under the output directory, an
    absolute path is used as given; unset, ``profiler_log`` under the output directory."""
    out = tmp_path / "out"
    for given, want in (
        ("traces", out / "traces"),
        (str(tmp_path / "abs"), tmp_path / "abs"),
        (None, out / "profiler_log"),
    ):
        section = {"enable": True, "scheduler": [1, 2]}
        if given is not None:
            section["profiler_log"] = given
        cfg = OmegaConf.create(
            {"Profiler": section, "Engine": {"save_load": {"output_dir": str(out)}}}
        )
        assert profiler_hook(cfg).trace_dir == str(want)


def test_unknown_optimizer_key_lists_the_arguments_the_yaml_may_set():
    """An unknown ``Optimizer`` key: the error lists the optimizer's arguments (from its
    signature) without ``params`` and ``lr``, which the Engine sets."""
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"unknown config key Optimizer\.bogus") as info:
        build_yaml_optimizer({"name": "AdamW", "lr": 0.1, "bogus": 1}, model)
    want = sorted(set(inspect.signature(torch.optim.AdamW).parameters) - {"params", "lr"})
    listed = re.search(r"AdamW takes: (.*)\)$", str(info.value)).group(1).split(", ")
    assert listed == want


def test_fused_adamw_is_fused_on_cuda_runs_only():
    """FleetX's ``FusedAdamW``: torch's AdamW with ``fused=True`` when the run's device is
    CUDA (the fused kernel runs on CPU tensors too, so the flag is checked here), plain
    AdamW elsewhere."""
    model = torch.nn.Linear(2, 2)
    section = {"name": "FusedAdamW", "lr": 0.1}
    on_cuda = build_yaml_optimizer(section, model, device_type="cuda")
    assert type(on_cuda) is torch.optim.AdamW and on_cuda.defaults["fused"] is True
    on_cpu = build_yaml_optimizer(section, model, device_type="cpu")
    assert type(on_cpu) is torch.optim.AdamW and not on_cpu.defaults["fused"]


def test_export_ignores_mixed_precision_settings(tmp_path):
    """Export runs in fp32 whatever ``Engine.mix_precision`` says (FleetX turns it off for
    export): a level training refuses (O3) does not stop an export's setup."""
    from libai.fleetx.yaml_setup import setup_yaml_run

    amp = ["Engine.mix_precision.enable=true", "Engine.mix_precision.level=O3"]
    with pytest.raises(YAMLConfigError, match=r"Engine\.mix_precision\.level='O3'"):
        setup_yaml_run(simple_cfg(tmp_path / "train", *amp), "train")
    setup_yaml_run(simple_cfg(tmp_path / "export", *amp), "export")
