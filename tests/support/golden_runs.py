"""Golden per-step losses of each front door, for refactors that must not change behaviour.

    python tests/support/golden_runs.py record golden.json     # before moving code
    python tests/support/golden_runs.py compare golden.json    # after: every loss bit for bit

Runs, each a few steps on tiny models and local data (nothing is downloaded): LiBai's
gpt2_pretrain.py through tools/train_net.py on 1 process and on tp2 x pp2 (4 processes);
FleetX's projects/gpt YAML and SimpleNet through tools/train.py; Rapidformer's BERT
sequence classification through tools/libai_accelerate.py on dp2. Bitwise equality holds on
one machine (the same kernels); record and compare on the same host. Not part of the suite:
it takes a few minutes and a recorded file is host-specific.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
# the helpers (tests/support/), then this checkout (projects/): run as a script, not by pytest
sys.path[:0] = [str(SUPPORT), str(SUPPORT.parents[1])]

from accelerate_helpers import task_argv  # noqa: E402
from engine_helpers import SIMPLE_NET, SMALL, run_tool, tiny_gpt_yaml_run  # noqa: E402
from launch import free_port  # noqa: E402
from train_net_helpers import ROOT, TINY, read_metrics, run_train_net, train_env  # noqa: E402

STEPS = 6


def _losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


def libai_runs(root: Path, env: dict) -> dict:
    config = ROOT / "configs" / "gpt2_pretrain.py"
    common = [*TINY, f"train.train_iter={STEPS}", "train.evaluation.enabled=False"]
    layouts = {
        "libai/gpt2-1proc": (1, []),
        "libai/gpt2-tp2pp2": (
            4,
            [
                "train.dist.tensor_parallel_size=2",
                "train.dist.pipeline_parallel_size=2",
                "train.num_accumulation_steps=2",
            ],
        ),
    }
    out = {}
    for name, (nproc, extra) in layouts.items():
        run_dir = root / name.replace("/", "-")
        opts = [*common, *extra, f"train.output_dir={run_dir}"]
        run_train_net(config, opts, nproc=nproc, env=env, timeout=900)
        out[name] = _losses(run_dir)
    return out


def fleetx_runs(root: Path, env: dict) -> dict:
    gpt_yaml = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
    runs = {
        "fleetx/gpt": (
            gpt_yaml,
            tiny_gpt_yaml_run(STEPS),
        ),
        "fleetx/simple_net": (SIMPLE_NET, [*SMALL, "Engine.eval_freq=-1"]),
    }
    out = {}
    for name, (config, overrides) in runs.items():
        run_dir = root / name.replace("/", "-")
        run_tool("train", config, *overrides, f"Engine.save_load.output_dir={run_dir}", env=env)
        out[name] = _losses(run_dir)
    return out


def accelerate_runs(root: Path, env: dict) -> dict:
    import accelerate_data as data
    import torch

    torch.manual_seed(0)  # the tiny model's random weights: the same in every recording
    files = {"bert": data.bert_dir(root / "files"), "cls": data.classification_csv(root / "files")}
    run_dir = root / "accelerate-bert-dp2"
    argv = task_argv(files, "sequence_classification", run_dir, model="bert", steps=STEPS)
    tool = ROOT / "tools" / "libai_accelerate.py"
    cmd = ["bash", str(ROOT / "tools" / "train.sh"), str(tool), "-", "2", *argv]
    env = {**env, "PORT": str(free_port())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"accelerate/bert-cls-dp2": _losses(run_dir)}


def record() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = train_env(LIBAI_SAMPLE_DATA_DIR=str(root / "sample"))
        return {
            **libai_runs(root, env),
            **fleetx_runs(root, env),
            **accelerate_runs(root, env),
        }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "compare"):
        print(__doc__)
        return 2
    action, path = argv
    got = record()
    if action == "record":
        Path(path).write_text(json.dumps(got, indent=2))
        print(f"recorded {len(got)} runs to {path}")
        return 0
    want = json.loads(Path(path).read_text())
    differ = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    for name, (now, before) in differ.items():
        print(f"{name}: differs\n  before {before}\n  now    {now}")
    print(f"{len(want) - len(differ)} of {len(want)} runs bitwise equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
