"""The run spec: one typed schema for the runtime's settings, read from every door."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from libai import dist
from libai.config import LazyConfig
from libai.runtime.spec import AmpSpec, DistSpec, RunSpec, ZeroSpec

ROOT = Path(__file__).resolve().parents[3]


def test_libai_train_file_is_the_spec_written_as_a_config():
    """configs/common/train.py (LiBai's file) holds exactly the spec's keys and defaults,
    plus the objects the door builds (scheduler, evaluator)."""
    train = LazyConfig.load(str(ROOT / "configs" / "common" / "train.py")).train
    assert dataclasses.asdict(RunSpec.from_config(train)) == dataclasses.asdict(RunSpec())
    spec_keys = {f.name for f in dataclasses.fields(RunSpec)} - {"warmup_iter"}
    assert set(train) - {"scheduler"} == spec_keys
    assert set(train.dist) == set(dist.DIST_CONFIG_KEYS)


def test_a_wrong_type_or_unknown_key_is_one_line_naming_it():
    train = LazyConfig.load(str(ROOT / "configs" / "gpt2_pretrain.py")).train
    train.train_iter = "many"
    with pytest.raises(ValueError, match=r"^train\.train_iter: Value 'many'") as err:
        RunSpec.from_config(train)
    assert "\n" not in str(err.value)
    train.train_iter = 3
    train.amp.dtyp = "fp16"
    with pytest.raises(
        ValueError, match=r"unknown config key train\.amp\.dtyp \(did you mean dtype"
    ):
        RunSpec.from_config(train)
    del train.amp["dtyp"]
    train.dist.tensor_paralel_size = 2
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        RunSpec.from_config(train)


def test_the_layout_is_typed_with_the_mesh_code_keys_and_defaults():
    """``RunSpec.dist`` is a dataclass holding exactly libai.dist's layout keys and defaults;
    a value of the wrong type is one line naming the key."""
    assert dataclasses.asdict(DistSpec()) == dist.DIST_CONFIG_KEYS
    spec = RunSpec.from_config({"dist": {"tensor_parallel_size": 2, "pipeline_schedule": "GPipe"}})
    assert isinstance(spec.dist, DistSpec)
    assert (spec.dist.tensor_parallel_size, spec.dist.pipeline_schedule) == (2, "GPipe")
    assert spec.dist.context_parallel_size == 1  # the defaults fill the rest
    with pytest.raises(ValueError, match=r"^train\.dist\.tensor_parallel_size: Value 'two'"):
        RunSpec.from_config({"dist": {"tensor_parallel_size": "two"}})
    with pytest.raises(ValueError, match=r"custom_pipeline_stage_id"):
        RunSpec.from_config({"dist": {"custom_pipeline_stage_id": ["a", "b"]}})


def test_the_other_doors_build_their_spec_through_the_validating_constructor():
    """FleetX's and Rapidformer's translations go through RunSpec.from_config: a value the
    schema refuses is an error naming the key, not a spec carrying it."""
    import argparse

    from libai.accelerate.arguments import train_namespace

    args = argparse.Namespace(
        save="out", micro_batch_size=2, global_batch_size=4, num_accumulation_steps=2,
        log_interval=1, seed=1, mixed_precision=False, mixed_precision_dtype="bf16", fp8=None,
        checkpoint_activations=False, recompute_granularity="full", zero_stage=None,
        save_interval=None, eval_interval=None, eval_iters=2,
    )  # fmt: skip
    spec = train_namespace(args, train_iter=5, dist_cfg={"data_parallel_size": 2})
    assert isinstance(spec.dist, DistSpec) and spec.dist.data_parallel_size == 2
    with pytest.raises(ValueError, match=r"train\.log_period"):
        train_namespace(
            argparse.Namespace(**{**vars(args), "log_interval": "often"}),
            train_iter=5,
            dist_cfg={},
        )
    with pytest.raises(ValueError, match=r"^train\.activation_checkpoint\.mode: "):
        no_mode = argparse.Namespace(**{**vars(args), "recompute_granularity": None})
        train_namespace(no_mode, train_iter=5, dist_cfg={})
    with pytest.raises(ValueError, match="tensor_paralel_size.*did you mean"):
        train_namespace(args, train_iter=5, dist_cfg={"tensor_paralel_size": 2})


def test_resolvers_turn_switches_into_what_runs():
    assert RunSpec().amp_dtype() is None
    assert RunSpec(amp=AmpSpec(enabled=True, dtype="fp16")).amp_dtype() is torch.float16
    assert RunSpec(amp=AmpSpec(enabled=True, dtype="bf16")).amp_dtype() is torch.bfloat16
    with pytest.raises(ValueError, match="train.amp.dtype"):
        RunSpec(amp=AmpSpec(enabled=True, dtype="fp8")).amp_dtype()
    spec = RunSpec()
    spec.activation_checkpoint.enabled = True
    assert spec.checkpointing() == "full"
    spec.activation_checkpoint.mode = "selective"
    assert spec.checkpointing() == "selective"
    spec.activation_checkpoint.mode = "some"
    with pytest.raises(ValueError, match="activation_checkpoint.mode"):
        spec.checkpointing()
    zero = RunSpec(zero_optimization=ZeroSpec(enabled=True, stage=2))
    assert zero.zero_stage(dist.resolve_layout({"data_parallel_size": 2}, 2)) == 2
    assert zero.zero_stage(dist.resolve_layout({}, 1)) is None  # one dp rank: nothing to shard


def test_the_three_doors_hand_the_runtime_a_spec(tmp_path):
    """LiBai's trainer, FleetX's Engine and Rapidformer's engine each build a RunSpec with the
    values of their own syntax."""
    from libai.accelerate.arguments import parse_args, train_namespace
    from libai.fleetx.yaml_config import load_yaml_config
    from libai.fleetx.yaml_setup import train_namespace as yaml_train_namespace

    args = parse_args(
        [
            "--task",
            "sequence_classification",
            "--pretrained-model-name-or-path",
            str(tmp_path),
            "--data-path",
            str(tmp_path),
            "--micro-batch-size",
            "4",
            "--train-iters",
            "20",
            "--mixed-precision",
            "--fp8",
            "tensorwise",
            "--save-interval",
            "7",
            "--save",
            str(tmp_path / "out"),
        ]
    )
    spec = train_namespace(args, train_iter=20, dist_cfg={})
    assert isinstance(spec, RunSpec)
    assert (spec.train_micro_batch_size, spec.checkpointer.period) == (4, 7)
    assert spec.amp.enabled and spec.output_dir == str(tmp_path / "out")
    assert spec.amp.fp8_recipe() == "tensorwise"

    yaml = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
    overrides = ["Engine.save_load.save_steps=3", "Engine.logging_freq=2"]
    cfg = load_yaml_config(str(yaml), [*overrides, "Engine.mix_precision.fp8=rowwise"])
    from libai.fleetx.yaml_config import resolve_batch_config

    resolve_batch_config(cfg, 1)
    spec = yaml_train_namespace(cfg, train_iter=9, steps_per_epoch=None, mode="train", has_eval=0)
    assert isinstance(spec, RunSpec)
    assert (spec.train_iter, spec.checkpointer.period, spec.log_period) == (9, 3, 2)
    assert spec.seed == cfg.Global.seed and not spec.evaluation.enabled
    assert spec.amp.fp8_recipe() == "rowwise"
    export = yaml_train_namespace(
        cfg, train_iter=9, steps_per_epoch=None, mode="export", has_eval=0
    )
    assert export.amp.fp8 is None


def test_a_frozen_spec_refuses_changes_and_its_yaml_reads_back_equal():
    """Run freezes the spec it built the run from: a later assignment (top level or nested)
    raises naming the field; its YAML (the run's ``run_spec.yaml``) reads back to an equal
    spec through the one validating constructor."""
    import dataclasses

    import yaml

    spec = RunSpec.from_config(
        {"train_iter": 7, "amp": {"enabled": True}, "dist": {"tensor_parallel_size": 2}}
    )
    spec.log_period = 3  # not frozen yet: a door may still resolve it
    assert spec.freeze() is spec and spec.frozen
    for target, name in (
        (spec, "train_iter"),
        (spec.amp, "dtype"),
        (spec.dist, "tensor_parallel_size"),
        (spec.evaluation, "eval_period"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"{name} cannot change"):
            setattr(target, name, getattr(target, name))
    back = RunSpec.from_config(yaml.safe_load(spec.to_yaml()))
    assert back == spec and not back.frozen
    assert (back.train_iter, back.log_period, back.dist.tensor_parallel_size) == (7, 3, 2)
