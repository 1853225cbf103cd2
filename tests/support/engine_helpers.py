"""The FleetX front door in tests: SimpleNet configs, engines built in-process, and task
modules that record their hooks or kill their own process (loaded by dotted path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from libai.fleetx import Engine
from libai.fleetx.yaml_config import load_yaml_config
from libai.fleetx.yaml_setup import build_module, setup_yaml_run
from projects.simple_net.module import SimpleNetModule

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the checkout
SIMPLE_NET = ROOT / "projects" / "simple_net" / "simple_net.yaml"
TRAIN = ROOT / "tools" / "train.py"
#: SimpleNet small and quick: 2 steps per epoch of 32 samples (global batch 16), 8 steps
SMALL = [
    "Global.global_batch_size=16",
    "Global.micro_batch_size=8",
    "Engine.max_steps=8",
    "Engine.logging_freq=1",
    "Engine.eval_freq=4",
    "Engine.eval_iters=2",
    "Data.Train.dataset.num_samples=32",
    "Data.Eval.dataset.num_samples=32",
    "Data.Test.dataset.num_samples=32",
]


def simple_cfg(out_dir, *overrides, path=SIMPLE_NET):
    return load_yaml_config(path, [*SMALL, f"Engine.save_load.output_dir={out_dir}", *overrides])


def make_engine(cfg, mode="train", module_cls=None):
    """setup_yaml_run + the module (``module_cls`` or Model.module) + Engine, in-process."""
    setup_yaml_run(cfg, mode)
    module = build_module(cfg) if module_cls is None else module_cls(cfg)
    return Engine(cfg, module, mode=mode)


class RecordingModule(SimpleNetModule):
    """SimpleNet that records every hook call (name, and the log_dict of the *_end hooks)."""

    def __init__(self, cfg):
        self.calls = []  # before nn.Module init: a plain attribute
        super().__init__(cfg)

    def _record(self, name, payload=None):
        self.calls.append((name, payload))


def _recording(name):
    base = getattr(SimpleNetModule, name)

    def hook(self, *args, **kwargs):
        self._record(name, dict(args[0]) if args and isinstance(args[0], dict) else None)
        return base(self, *args, **kwargs)

    hook.__name__ = name
    return hook


for _name in (
    "get_model",
    "get_loss_fn",
    "configure_optimizers",
    "pretreating_batch",
    "training_step",
    "backward",
    "training_step_end",
    "training_epoch_end",
    "validation_step",
    "validation_step_end",
    "validation_epoch_end",
    "test_step",
    "test_step_end",
    "predict_step",
    "predict_step_end",
    "inference_end",
):
    setattr(RecordingModule, _name, _recording(_name))


class KillAtStepModule(SimpleNetModule):
    """SimpleNet whose process SIGKILLs itself in ``training_step_end`` of step
    ``Model.kill_at_step`` (a crash mid-run, at a known point)."""

    def training_step_end(self, log_dict):
        super().training_step_end(log_dict)
        step = log_dict["epoch"] * log_dict["total_batch"] + log_dict["batch"]
        if step == self.cfg.Model.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)


def run_tool(tool, config, *overrides, nproc=1, env=None, timeout=300, check=True, launcher="fork"):
    """``tools/<tool>.py -c config -o ...`` on ``nproc`` processes: forked from the session's
    preloaded server where the environment allows (as :func:`train_net_helpers.run_train_net`),
    else (or with ``launcher="train.sh"``) ``python`` / ``tools/train.sh``."""
    tool_path = str(ROOT / "tools" / f"{tool}.py")
    if launcher == "fork":
        from train_net_helpers import run_forked

        argv = [tool_path, "-c", str(config), *[x for o in overrides for x in ("-o", o)]]
        proc = run_forked(argv, nproc=nproc, env=env, timeout=timeout)
        if proc is not None:
            if check:
                assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-8000:]}"
            return proc
    if nproc == 1:
        cmd = [sys.executable, tool_path, "-c", str(config)]
    else:
        cmd = ["bash", str(ROOT / "tools" / "train.sh"), tool_path, str(config), str(nproc)]
    return run_command(cmd, overrides, nproc=nproc, env=env, timeout=timeout, check=check)


#: projects/gpt's YAML shrunk to the tiny GPT of train_net_helpers.TINY (CPU, no dropout)
TINY_GPT_YAML = [
    "Global.device=cpu",
    "Model.hidden_layers=2",
    "Model.hidden_size=32",
    "Model.num_attention_heads=2",
    "Model.ffn_hidden_size=64",
    "Model.max_seq_length=32",
    "Model.embedding_dropout_prob=0.0",
    "Model.attention_dropout_prob=0.0",
    "Model.output_dropout_prob=0.0",
]


def run_command(cmd, overrides, *, nproc=1, env=None, timeout=300, check=True):
    """``cmd -o override ...`` from the repository root (a launcher script or a tool), with
    the repository and tests/support/ importable and a per-test port."""
    from launch import free_port
    from train_net_helpers import train_env

    cmd = [*cmd, *[x for o in overrides for x in ("-o", o)]]
    env = dict(env or train_env())
    support = str(ROOT / "tests" / "support")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), support, env.get("PYTHONPATH", "")])
    env["PORT"] = str(free_port())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check:
        assert proc.returncode == 0, (
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def tiny_gpt_yaml_run(steps: int) -> list[str]:
    """projects/gpt's YAML as a quick fp32 run of ``steps`` steps: the tiny GPT, 4 samples a
    step, a loss logged every step, no evaluation."""
    return [
        *TINY_GPT_YAML,
        f"Engine.max_steps={steps}",
        "Engine.logging_freq=1",
        "Engine.eval_freq=-1",
        "Engine.mix_precision.enable=false",
        "Global.local_batch_size=4",
        "Global.micro_batch_size=null",
    ]
