"""tools/align.py: transformers vs libai on tiny GPT-2 and Llama directories, a perturbed
checkpoint found at its module, a trainer checkpoint and a bare config, a tp2 run under
torchrun, and bad input (exit status 2 before anything is built)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "align.py"
PERTURBED = "transformer.h.1.mlp.c_proj.weight"


def run_tool(*args: str, nproc: int = 1, timeout: float = 240) -> subprocess.CompletedProcess:
    launcher = [sys.executable]
    if nproc > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc_per_node={nproc}",
        ]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [*launcher, str(TOOL), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny transformers GPT-2 and Llama directories, and a GPT-2 copy with one weight
    perturbed in model.safetensors."""
    import transformers

    root = tmp_path_factory.mktemp("align_tool")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=50,
        n_positions=32,
        resid_pdrop=0,
        embd_pdrop=0,
        attn_pdrop=0,
    )
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(root / "gpt2")
    llama = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=32,
    )
    transformers.LlamaForCausalLM(llama).save_pretrained(root / "llama")
    shutil.copytree(root / "gpt2", root / "gpt2_bad")
    weights = root / "gpt2_bad" / "model.safetensors"
    tensors = load_file(weights)
    tensors[PERTURBED][0, 0] += 0.1
    save_file(tensors, weights, metadata={"format": "pt"})
    return root


def test_gpt2_transformers_vs_libai_passes(dirs):
    proc = run_tool("--base", f"hf:{dirs / 'gpt2'}", "--raw", f"libai:{dirs / 'gpt2'}")
    assert proc.returncode == 0, output(proc)
    assert "GPT2LMHeadModel" in proc.stdout and "GPTForPreTraining" in proc.stdout
    for line in ("forward: ok", "backward: ok", "grads: ok", "weights: ok", "align: PASS"):
        assert line in proc.stdout, output(proc)


def test_perturbed_checkpoint_is_found_at_its_module(dirs, tmp_path):
    dump = tmp_path / "dump"
    proc = run_tool(
        "--base",
        f"hf:{dirs / 'gpt2'}",
        "--raw",
        f"libai:{dirs / 'gpt2_bad'}",
        "--dump-root",
        str(dump),
    )
    assert proc.returncode == 1, output(proc)
    assert "forward: DIFF at key 'transformer.h.1.mlp.c_proj'" in proc.stdout, output(proc)
    assert f"first key '{PERTURBED}'" in proc.stdout  # the weights check names the tensor
    assert "align: FAIL" in proc.stdout
    log = (dump / "align_log" / "report_forward_step_0_rank_0.log").read_text()
    (here,) = [line for line in log.splitlines() if "*** HERE ***" in line]
    assert here.startswith("      transformer.h.1.mlp.c_proj (call 0)")
    assert "GPT_model.transformer.layers.1.mlp.dense_4h_to_h" in here


def test_llama_transformers_vs_libai_passes(dirs):
    proc = run_tool("--base", f"hf:{dirs / 'llama'}", "--raw", f"libai:{dirs / 'llama'}")
    assert proc.returncode == 0, output(proc)
    assert "forward: ok" in proc.stdout and "align: PASS" in proc.stdout


def test_trainer_checkpoint_and_bare_config(dirs, tmp_path):
    """A trainer output dir against its own Hugging Face export; a LazyConfig file gets the
    weights of the other side."""
    from libai import dist
    from libai.checkpoint.checkpointer import Checkpointer
    from libai.config import LazyConfig, instantiate
    from libai.models.utils import save_huggingface

    config = tmp_path / "tiny_gpt.py"
    config.write_text(
        "from libai.config import LazyCall\n"
        "from libai.models import GPTForPreTraining\n\n"
        "model = LazyCall(GPTForPreTraining)(\n"
        "    cfg=dict(hidden_layers=2, vocab_size=50, hidden_size=16, ffn_hidden_size=64,\n"
        "             num_attention_heads=2, max_seq_length=32)\n"
        ")\n"
    )
    dist.setup_dist_util({})
    cfg = LazyConfig.load(str(config))
    torch.manual_seed(3)
    model = instantiate(cfg.model)
    run = tmp_path / "run"
    Checkpointer(model, str(run)).save("model_final", iteration=1)  # + last_checkpoint
    LazyConfig.save(cfg, str(run / "config.yaml"))
    save_huggingface(model, str(tmp_path / "export"))
    proc = run_tool("--base", f"hf:{tmp_path / 'export'}", "--raw", f"libai:{run}")
    assert proc.returncode == 0 and "align: PASS" in proc.stdout, output(proc)
    proc = run_tool(
        "--base", f"libai:{run / 'model_final'}", "--raw", f"libai:{config}", "--phase", "forward"
    )
    assert proc.returncode == 0 and "align: PASS" in proc.stdout, output(proc)
    assert "backward" not in proc.stdout  # --phase forward runs no backward


def test_tp2_under_torchrun(dirs, tmp_path):
    dump = tmp_path / "dump"
    proc = run_tool(
        "--base",
        f"hf:{dirs / 'gpt2'}",
        "--raw",
        f"libai:{dirs / 'gpt2'}",
        "--tp",
        "2",
        "--dump-root",
        str(dump),
        nproc=2,
    )
    # torchrun sometimes aborts a rank at exit after everything passed: judge by the output
    assert "align: PASS" in proc.stdout, output(proc)
    assert proc.stdout.count("[libai.align] report") == 1  # rank 0 prints, rank 1 to a file
    assert "weights: ok" in (dump / "report_rank_1.txt").read_text()
    # the libai model really ran sharded: rank 1 recorded a column-parallel output shard
    report = json.loads((dump / "rank_1/raw/step_0/rank_1/report.json").read_text())
    assert report["layout"]["tp"] == 2 and report["layout"]["tp_rank"] == 1
    fc = next(n for n in report["nodes"] if n["route"].endswith("layers.0.mlp.dense_h_to_4h"))
    assert fc["outputs"][0]["placements"] == ["S(-1)"]
    assert fc["outputs"][0]["shape"] == [2, 16, 64]  # gathered to the full width


# ---- bad input: exit status 2 with a message naming the flag, before anything is built -----


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("align_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["align_tool"] = module  # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("align_tool", None)


def test_bad_prefix_exits_2_from_the_command_line(dirs):
    proc = run_tool("--base", f"foo:{dirs / 'gpt2'}", "--raw", f"libai:{dirs / 'gpt2'}")
    assert proc.returncode == 2, output(proc)
    assert "--base 'foo:" in proc.stderr and "expected hf:DIR" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--base", "hf:{d}/nowhere", "--raw", "libai:{d}/gpt2"], "nowhere does not exist"),
        (
            ["--base", "hf:{d}/gpt2", "--raw", "libai:{d}/gpt2", "--tp", "2"],
            "--tp 2 --pp 1 needs 2 process(es) but WORLD_SIZE is 1: torchrun --nproc_per_node 2",
        ),
        (["--base", "hf:{d}/gpt2", "--raw", "libai:{d}/gpt2", "--pp", "2"], "not supported"),
        (["--base", "hf:{d}/gpt2", "--raw", "libai:{d}/gpt2", "--seq", "64"], "--seq 32"),
        (["--base", "hf:{d}/bert", "--raw", "libai:{d}/gpt2"], "supported: causal LMs"),
        (["--base", "hf:{d}/gpt2", "--raw", "libai:{d}"], "not a Hugging Face directory"),
        (["--base", "hf:{d}/gpt2", "--raw", "libai:{d}/gpt2/config.json"], "LazyConfig"),
        (["--base", "hf:{d}/gpt2", "--raw", "libai:{d}/gpt2", "--dump-root", "{d}"], "empty"),
    ],
)
def test_bad_input_exits_2(tool, dirs, monkeypatch, capsys, args, message):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    bert = dirs / "bert"
    bert.mkdir(exist_ok=True)
    (bert / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    )
    assert tool.main([a.format(d=dirs) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
