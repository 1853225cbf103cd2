"""FleetX YAML configs: inheritance, overrides, derived batch sizes, and every kind of bad
input failing early with a message that names the key and the fix."""

from __future__ import annotations

import logging
import textwrap

import pytest
import torch
from engine_helpers import SIMPLE_NET, make_engine, run_tool, simple_cfg

from libai import dist
from libai.fleetx import yaml_setup
from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config, resolve_batch_config


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_base_inheritance_merges_and_inherited_false_replaces(tmp_path):
    (tmp_path / "sub").mkdir()
    write(
        tmp_path / "root.yaml",
        """
        Global: {global_batch_size: 8}
        Engine: {max_steps: 5, mix_precision: {enable: True, dtype: bfloat16}}
        Model: {module: GPTModule, hidden_size: 64, hidden_layers: 2, tokenizer: {vocab_file: a}}
        Optimizer: {name: AdamW, weight_decay: 0.1, lr: {name: Constant, learning_rate: 0.1}}
        """,
    )
    write(tmp_path / "sub" / "mid.yaml", "_base_: ../root.yaml\nEngine: {max_steps: 7}\n")
    child = write(
        tmp_path / "sub" / "child.yaml",
        """
        _base_: ./mid.yaml
        Engine:
          mix_precision: {dtype: float16}
        Model:
          hidden_size: 128
          tokenizer: {_inherited_: False, merges_file: b}
        Optimizer:
          lr: 0.5
        """,
    )
    cfg = load_yaml_config(child)
    assert cfg.Engine.max_steps == 7  # mid overrides root
    assert cfg.Engine.mix_precision.enable is True and cfg.Engine.mix_precision.dtype == "float16"
    assert cfg.Model.hidden_size == 128 and cfg.Model.hidden_layers == 2
    assert dict(cfg.Model.tokenizer) == {"merges_file": "b"}  # replaced, not merged
    assert cfg.Optimizer.lr == 0.5 and cfg.Optimizer.weight_decay == 0.1
    assert cfg.Engine.logging_freq == 1  # defaults filled
    write(tmp_path / "a.yaml", "_base_: b.yaml\nModel: {module: X}\n")
    write(tmp_path / "b.yaml", "_base_: a.yaml\n")
    with pytest.raises(YAMLConfigError, match="include each other"):
        load_yaml_config(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", "_base_: missing.yaml\nModel: {module: X}\n")
    with pytest.raises(FileNotFoundError, match=r"missing.yaml does not exist \(the _base_ of"):
        load_yaml_config(tmp_path / "c.yaml")


def test_overrides_change_add_and_name_the_closest_key(tmp_path, caplog):
    cfg = load_yaml_config(SIMPLE_NET, ["Engine.max_steps=3", "+Model.extra=1"])
    assert cfg.Engine.max_steps == 3 and cfg.Model.extra == 1
    # FleetX's -o of a key the config lacks adds it ("A new field ... detected!", Paddle's
    # override); one that nothing here reads is named, with the closest key, and dropped
    default_steps = load_yaml_config(SIMPLE_NET).Engine.max_steps
    with caplog.at_level(logging.WARNING, logger="libai.fleetx.yaml_config"):
        cfg = load_yaml_config(SIMPLE_NET, ["Engine.max_step=3", "Model.new_knob=2"])
    assert "A new field (Engine.max_step) detected!" in caplog.text
    assert (
        "FleetX key Engine.max_step=3 (set by -o) has no effect here: no part of this door "
        "reads it; did you mean Engine.max_steps or" in caplog.text
    )
    assert "max_step" not in cfg.Engine and cfg.Engine.max_steps == default_steps
    assert cfg.Model.new_knob == 2  # Model is an open section: the module's own keys
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="libai.fleetx.yaml_config"):
        cfg = load_yaml_config(SIMPLE_NET, ["+Model.knob=1", "Model.knob=2"])  # in order
    assert cfg.Model.knob == 2 and "new field" not in caplog.text
    bad = write(
        tmp_path / "bad.yaml", "_base_: " + str(SIMPLE_NET) + "\nEngine: {logging_frequency: 2}\n"
    )
    with pytest.raises(
        YAMLConfigError, match=r"Engine.logging_frequency; did you mean Engine.logging_freq"
    ):
        load_yaml_config(bad)
    with pytest.raises(
        YAMLConfigError, match=r"Engine.save_load.save_step; did you mean .*save_steps"
    ):
        load_yaml_config(SIMPLE_NET, ["+Engine.save_load.save_step=3"])
    with pytest.raises(YAMLConfigError, match=r"<top level>.Profilerr; did you mean .*Profiler"):
        load_yaml_config(SIMPLE_NET, ["+Profilerr.enable=true"])
    with pytest.raises(YAMLConfigError, match="Data.Train.loaderr; did you mean"):
        load_yaml_config(SIMPLE_NET, ["+Data.Train.loaderr.num_workers=1"])


def test_batch_sizes_are_derived_and_a_contradiction_is_an_error():
    def resolved(*overrides, world=4):
        return resolve_batch_config(load_yaml_config(SIMPLE_NET, list(overrides)), world)

    cfg = resolved("Global.global_batch_size=32", "Global.micro_batch_size=4")
    assert (cfg.Global.local_batch_size, cfg.Engine.accumulate_steps) == (8, 2)
    assert cfg.Distributed.dp_degree == 4
    cfg = resolved(
        "~Global.global_batch_size", "Global.local_batch_size=6", "Global.micro_batch_size=3"
    )
    assert (cfg.Global.global_batch_size, cfg.Engine.accumulate_steps) == (24, 2)
    assert (
        resolved("Engine.accumulate_steps=2", "Global.micro_batch_size=4").Engine.accumulate_steps
        == 2
    )
    with pytest.raises(
        YAMLConfigError,
        match=r"Engine.accumulate_steps=4 contradicts.*global_batch_size 32 / \(Global.micro_batch_size 4 "
        r"x 4 data-parallel ranks\) = 2 micro-batches per step",
    ):
        resolved("Engine.accumulate_steps=4", "Global.micro_batch_size=4")
    with pytest.raises(
        YAMLConfigError, match="32 is not divisible by .* 16 x 3 data-parallel ranks"
    ):
        resolved(world=3)
    with pytest.raises(
        YAMLConfigError,
        match=r"global_batch_size=32 is not divisible by Global.micro_batch_size 3 x 4 data-parallel "
        r"ranks = 12, so Engine.accumulate_steps cannot be derived",
    ):
        resolved("Global.micro_batch_size=3")
    with pytest.raises(YAMLConfigError, match=r"dp_degree 3 x mp_degree 1.*= 3, but 4 processes"):
        resolved("Distributed.dp_degree=3")
    # context parallel (ours: Distributed.cp_degree) takes ranks from the data-parallel ones
    assert resolved("Distributed.cp_degree=2").Distributed.dp_degree == 2
    with pytest.raises(YAMLConfigError, match=r"3 processes are not divisible by .* x cp_degree 2"):
        resolved("Distributed.cp_degree=2", world=3)
    with pytest.raises(YAMLConfigError, match="Distributed.cp_degree must be a positive integer"):
        resolved("Distributed.cp_degree=0")
    # expert parallel (ours: Distributed.ep_degree): it must divide the dp ranks
    assert resolved("Distributed.ep_degree=1", "Distributed.cp_degree=2").Distributed.dp_degree == 2
    micro4 = "Global.micro_batch_size=4"
    assert resolved("Distributed.ep_degree=2", micro4).Distributed.ep_degree == 2
    with pytest.raises(
        YAMLConfigError, match=r"^Distributed.ep_degree=3 must divide the 4 data-parallel ranks"
    ):
        resolved("Distributed.ep_degree=3", micro4)


def test_names_that_do_not_resolve_are_clear_errors(tmp_path):
    with pytest.raises(
        ValueError, match=r"Model.module: unknown name 'GPTModul'; did you mean GPTModule"
    ):
        make_engine(simple_cfg(tmp_path, "Model.module=GPTModul"))
    with pytest.raises(
        ValueError,
        match="Data.Train.dataset.name: cannot import 'projects.simple_net.dataset.Nope'",
    ):
        make_engine(
            simple_cfg(tmp_path, "Data.Train.dataset.name=projects.simple_net.dataset.Nope")
        )
    with pytest.raises(
        ValueError,
        match=r"Data.Train.dataset.name: unknown name 'GPTDatset'; did you mean GPTDataset",
    ):
        make_engine(simple_cfg(tmp_path, "Data.Train.dataset.name=GPTDatset"))
    with pytest.raises(
        ValueError,
        match=r"Data.Train.dataset.num_sample; did you mean Data.Train.dataset.num_samples",
    ):
        make_engine(simple_cfg(tmp_path, "+Data.Train.dataset.num_sample=3"))
    with pytest.raises(ValueError, match=r"Data.Train.sampler.name: unknown name 'Cyclic'"):
        make_engine(simple_cfg(tmp_path, "Data.Train.sampler.name=Cyclic"))
    with pytest.raises(ValueError, match="unknown config key Optimizer.betaa"):
        make_engine(simple_cfg(tmp_path, "+Optimizer.betaa=1"))
    with pytest.raises(ValueError, match=r"Optimizer.lr.\['warmup'\]"):
        make_engine(simple_cfg(tmp_path, "+Optimizer.lr.warmup=3"))
    with pytest.raises(ValueError, match="level='O3' is not supported"):
        make_engine(
            simple_cfg(
                tmp_path, "Engine.mix_precision.enable=true", "Engine.mix_precision.level=O3"
            )
        )
    with pytest.raises(ValueError, match=r"custom_black_list: unknown op name 'softmaxx'"):
        make_engine(
            simple_cfg(
                tmp_path,
                "Engine.mix_precision.enable=true",
                "Engine.mix_precision.custom_black_list=[softmaxx]",
            )
        )


def test_model_parallel_on_a_plain_module_fails_before_any_collective(tmp_path, monkeypatch):
    def no_mesh(*args, **kwargs):
        raise AssertionError("the mesh (a collective) was created before the check")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "setup_dist_util", no_mesh)
    monkeypatch.setattr(yaml_setup.dist, "setup_dist_util", no_mesh)
    for override, key in (
        ("Distributed.mp_degree=2", "mp_degree=2"),
        ("Distributed.pp_degree=2", "pp_degree=2"),
    ):
        cfg = simple_cfg(tmp_path, override, "Distributed.pipeline_num_layers=4")
        with pytest.raises(
            YAMLConfigError, match=rf"SimpleNetModule builds a plain nn.Module.*{key}"
        ):
            yaml_setup.setup_yaml_run(cfg)
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = simple_cfg(
        tmp_path,
        "Distributed.dp_degree=2",
        "Distributed.sharding.sharding_degree=2",
        "Global.micro_batch_size=4",
    )
    with pytest.raises(YAMLConfigError, match="hybrid sharding"):
        yaml_setup.setup_yaml_run(cfg)


def test_the_tool_reports_bad_input_in_one_line_before_training(tmp_path):
    proc = run_tool(
        "train",
        SIMPLE_NET,
        f"Engine.save_load.output_dir={tmp_path}",
        "Engine.accumulate_steps=3",
        check=False,
    )
    assert proc.returncode == 1
    assert "error: YAMLConfigError: Engine.accumulate_steps=3 contradicts" in proc.stderr
    assert "Traceback" not in proc.stderr and "Starting training" not in proc.stdout + proc.stderr
    proc = run_tool(
        "train", SIMPLE_NET, "Distributed.mp_degree=2", nproc=2, check=False, timeout=120
    )
    assert proc.returncode != 0
    assert "builds a plain nn.Module: tensor parallel (Distributed.mp_degree=2)" in proc.stderr
    assert "Starting training" not in proc.stdout + proc.stderr
    # context parallel (ours) needs a model whose attention runs across sequence shards
    proc = run_tool("train", SIMPLE_NET, "Distributed.cp_degree=2", nproc=2, check=False)
    assert proc.returncode != 0
    assert "builds a plain nn.Module: context parallel (Distributed.cp_degree=2)" in proc.stderr


def test_overrides_apply_before_the_key_check_and_tilde_deletes(tmp_path):
    """FleetX applies ``-o`` before checking keys: ``-o ~Section`` removes a section this
    door does not know; without it the key is an error naming it."""
    cfg_file = tmp_path / "with_custom.yaml"
    cfg_file.write_text(f"_base_: {SIMPLE_NET}\nCustom:\n  enable: false\n  scheduler: [1, 5]\n")
    with pytest.raises(YAMLConfigError, match=r"unknown config key <top level>\.Custom"):
        load_yaml_config(str(cfg_file))
    cfg = load_yaml_config(str(cfg_file), ["~Custom", "Engine.max_steps=3"])
    assert "Custom" not in cfg and cfg.Engine.max_steps == 3


def test_fleetx_module_conventions(tmp_path):
    """``self.configs`` and the ``process_configs`` hook (FleetX's BasicModule), before the
    model is built; ``self.cfg`` is the same object. GPT's ``ffn_hidden_size: null`` is
    4 x hidden, as FleetX."""
    from engine_helpers import TINY_GPT_YAML, SimpleNetModule

    seen = []

    class Module(SimpleNetModule):
        def process_configs(self, configs):
            seen.append(configs.Engine.max_steps)
            configs.Engine.max_steps = 5
            return configs

    cfg = simple_cfg(tmp_path, "Engine.max_steps=2")
    dist.setup_dist_util({})
    module = Module(cfg)
    assert seen == [2] and module.configs is module.cfg and module.cfg.Engine.max_steps == 5

    from engine_helpers import ROOT

    from libai.fleetx.modules.gpt import GPTModule

    yaml = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
    gpt_cfg = load_yaml_config(str(yaml), [*TINY_GPT_YAML, "Model.ffn_hidden_size=null"])
    gpt = GPTModule(gpt_cfg)
    mlp = gpt.model.GPT_model.transformer.layers["0"].mlp
    assert mlp.dense_h_to_4h.weight.shape[0] == 4 * 32


def test_mix_precision_o2_keeps_low_precision_parameters_and_fp32_masters(tmp_path):
    """FleetX's level O2 (every FleetX GPT config): the model's parameters in the low dtype
    (norms fp32), the optimizer stepping fp32 masters (libai.runtime.master_weights, whose
    numbers tests/unit/runtime/test_master_weights.py checks)."""
    engine = make_engine(
        simple_cfg(tmp_path, "Engine.mix_precision.enable=true", "Engine.mix_precision.level=O2")
    )
    dtypes = {p.dtype for p in engine.parts.runner.model.parameters()}
    assert torch.float16 in dtypes  # the YAML's mix_precision.dtype
    stepped = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert stepped and all(p.dtype == torch.float32 for p in stepped)


@pytest.mark.parametrize("hook", ["training_step", "validation_step"])
def test_a_module_with_its_own_loss_is_refused_under_context_parallel(hook):
    """Under Distributed.cp_degree > 1 each rank runs its share of every sequence through
    the model's own loss: a module replacing the loss (training or evaluation) is refused
    with one line naming the hook and the key; with cp_degree 1 it is accepted."""
    from types import SimpleNamespace

    from libai.fleetx.engine import Engine
    from libai.fleetx.module import BasicModule

    own = type("OwnLoss", (BasicModule,), {hook: lambda self, batch: torch.zeros(())})
    module = own.__new__(own)
    torch.nn.Module.__init__(module)
    module.model = torch.nn.Linear(2, 2)

    def engine(cp):
        layout = SimpleNamespace(context_parallel_size=cp, pipeline_parallel_size=1)
        return SimpleNamespace(module=module, util=SimpleNamespace(layout=layout))

    Engine._check_module(engine(1))
    with pytest.raises(ValueError, match=rf"OwnLoss overrides {hook}: .*cp_degree=2"):
        Engine._check_module(engine(2))
