"""One core, two front doors: GPT pretraining through the FleetX Engine (the YAMLs and
launchers of projects/gpt, GPTModule) gives the same per-step losses as tools/train_net.py on
the same config values, on 1 process and on dp2, tp2, pp2 and cp2."""

from __future__ import annotations

import pytest
from engine_helpers import ROOT, run_command, tiny_gpt_yaml_run
from train_net_helpers import TINY, read_metrics, run_train_net

STEPS = 5
#: the same tiny GPT, data, optimizer and schedule in both vocabularies
YAML = [
    *tiny_gpt_yaml_run(STEPS),
    "Optimizer.name=AdamW",
    "~Optimizer.lr",
    "+Optimizer.lr={name: WarmupCosineLR, learning_rate: 2e-3, warmup_factor: 0.001, "
    "alpha: 0.01, warmup_ratio: 0.05}",
]
LIBAI = [*TINY, f"train.train_iter={STEPS}", "train.evaluation.enabled=false"]
#: layout -> (processes, projects/gpt launcher, YAML overrides, LiBai overrides)
LAYOUTS = {
    "single": (1, "single_card", [], []),
    "dp2": (2, "dp2", ["Global.local_batch_size=2"], ["train.train_micro_batch_size=2"]),
    "tp2": (2, "mp2", [], ["train.dist.tensor_parallel_size=2"]),
    # Distributed.cp_degree (ours): each sequence split over the 2 ranks, as LiBai's key
    "cp2": (
        2,
        "dp2",
        ["Distributed.dp_degree=1", "Distributed.cp_degree=2"],
        ["train.dist.context_parallel_size=2"],
    ),
    "pp2": (
        2,
        "pp2",
        ["Global.micro_batch_size=2"],
        [
            "train.dist.pipeline_parallel_size=2",
            "train.train_micro_batch_size=2",
            "train.num_accumulation_steps=2",
        ],
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_engine_and_train_net_give_the_same_losses(sample_env, tmp_path, layout):
    nproc, launcher, yaml_layout, libai_layout = LAYOUTS[layout]
    engine_out, trainer_out = tmp_path / "engine", tmp_path / "train_net"
    run_train_net(
        ROOT / "configs" / "gpt2_pretrain.py",
        [*LIBAI, *libai_layout, f"train.output_dir={trainer_out}"],
        nproc=nproc,
        env=sample_env,
    )
    script = ROOT / "projects" / "gpt" / f"pretrain_gpt_345M_{launcher}.sh"
    overrides = [*YAML, *yaml_layout, f"Engine.save_load.output_dir={engine_out}"]
    run_command(["bash", str(script)], overrides, nproc=nproc, env=sample_env)
    a, b = read_metrics(engine_out), read_metrics(trainer_out)
    assert sorted(a) == sorted(b) == list(range(STEPS))
    for i in range(STEPS):
        assert a[i]["total_loss"] == b[i]["total_loss"], (layout, i, a[i], b[i])
        assert a[i]["lr"] == b[i]["lr"]


def test_gpt_evaluation_through_the_engine_equals_the_model_by_hand(tmp_path):
    """projects/gpt's YAML with evaluation on (FleetX's GPT module returns ``lm_loss``, not
    ``loss``): Engine.evaluate is the mean of the model's own ``lm_loss`` over the same
    ``Engine.eval_iters`` batches, computed here by hand."""
    import torch
    from engine_helpers import TINY_GPT_YAML, make_engine

    from libai.fleetx.yaml_config import load_yaml_config
    from libai.runtime.trainer import to_device

    yaml = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
    cfg = load_yaml_config(
        str(yaml),
        [
            *TINY_GPT_YAML,
            "Engine.max_steps=2",
            "Engine.eval_freq=2",
            "Engine.eval_iters=2",
            "Engine.mix_precision.enable=false",
            "Global.local_batch_size=4",
            "Global.micro_batch_size=null",
            f"Engine.save_load.output_dir={tmp_path}",
        ],
    )
    engine = make_engine(cfg)
    results = engine.evaluate()
    model = engine.runner.model.eval()
    want = []
    with torch.no_grad():
        for i, batch in enumerate(engine.valid_loader):
            if i == 2:
                break
            batch = engine.module.pretreating_batch(to_device(batch, "cpu"))
            want.append(float(model(**batch)["lm_loss"]))
    assert results["loss"] == pytest.approx(sum(want) / len(want), rel=1e-6)


def test_context_parallel_evaluation_equals_one_process(sample_env, tmp_path):
    """Distributed.cp_degree=2 with evaluation on: the FleetX Engine scores through the
    runner's own loss over the sequence shards (the module's default validation_step would
    run whole sequences), and its evaluation losses equal one process's."""
    evaluation = ["Engine.eval_freq=2", "Engine.eval_iters=2"]
    runs = {}
    for name, launcher, nproc, layout in (
        ("one", "single_card", 1, []),
        ("cp2", "dp2", 2, ["Distributed.dp_degree=1", "Distributed.cp_degree=2"]),
    ):
        out = tmp_path / name
        script = ROOT / "projects" / "gpt" / f"pretrain_gpt_345M_{launcher}.sh"
        overrides = [*YAML, *evaluation, *layout, f"Engine.save_load.output_dir={out}"]
        run_command(["bash", str(script)], overrides, nproc=nproc, env=sample_env)
        runs[name] = read_metrics(out)
    one, cp2 = runs["one"], runs["cp2"]
    evaluated = [i for i in sorted(one) if "eval_loss" in one[i]]
    assert evaluated and evaluated == [i for i in sorted(cp2) if "eval_loss" in cp2[i]]
    for i in evaluated:
        assert cp2[i]["eval_loss"] == pytest.approx(one[i]["eval_loss"], rel=1e-5, abs=1e-6)
        assert cp2[i]["total_loss"] == pytest.approx(one[i]["total_loss"], rel=1e-5, abs=1e-6)


def test_a_lora_section_trains_as_train_lora_does(sample_env, tmp_path):
    """FleetX's YAML with our ``Lora:`` section (PEFT's field names) and LiBai's
    ``train.lora`` give the same per-step losses on tp2 (the same transform applied by the
    one runtime), and differ from full fine-tuning."""
    lora = "[c_attn,c_proj]"
    nproc, launcher, yaml_layout, libai_layout = LAYOUTS["tp2"]
    engine_out, trainer_out = tmp_path / "engine", tmp_path / "train_net"
    run_train_net(
        ROOT / "configs" / "gpt2_pretrain.py",
        [*LIBAI, *libai_layout, f"train.output_dir={trainer_out}",
         f"train.lora.target_modules={lora}", "train.lora.r=4"],
        nproc=nproc,
        env=sample_env,
    )  # fmt: skip
    script = ROOT / "projects" / "gpt" / f"pretrain_gpt_345M_{launcher}.sh"
    overrides = [*YAML, *yaml_layout, f"Engine.save_load.output_dir={engine_out}",
                 f"Lora.target_modules={lora}", "Lora.r=4"]  # fmt: skip
    run_command(["bash", str(script)], overrides, nproc=nproc, env=sample_env)
    a, b = read_metrics(engine_out), read_metrics(trainer_out)
    assert sorted(a) == sorted(b) == list(range(STEPS))
    for i in range(STEPS):
        assert a[i]["total_loss"] == b[i]["total_loss"], (i, a[i], b[i])
    full = tmp_path / "full"
    run_command(["bash", str(script)], [*YAML, *yaml_layout,
                f"Engine.save_load.output_dir={full}"], nproc=nproc, env=sample_env)  # fmt: skip
    assert read_metrics(full)[STEPS - 1]["total_loss"] != a[STEPS - 1]["total_loss"]
