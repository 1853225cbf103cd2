"""libai.accelerate's black box: every task trains on 1 process and on dp2 with its metric;
a zoo architecture under tp2 and pp2 equals one process and writes back a Hugging Face
directory with exactly the trained weights; bad input fails early with a clear message."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import transformers
from accelerate_helpers import METRICS, TASKS, task_argv
from launch import free_port, torchrun
from safetensors.torch import load_file
from train_net_helpers import ROOT, read_metrics, train_env

from libai import dist
from libai.accelerate import cli

#: losses of two layouts after AdamW steps: fp32 rounding amplified (gpt_reference.adam_param_tol)
LOSS_TOL = 1e-4
#: tasks whose loss is a mean over a varying number of tokens per micro-batch: a step's loss
#: is the mean of its micro-batches' token means (Megatron's rule), so dp2 equals one process
#: running the same two micro-batches (accumulation), not one batch of 8. (masked_lm trains
#: the zoo's BERT, whose masked-LM loss is the token mean over the whole data-parallel batch,
#: LiBai's rule: dp2 equals one batch of 8.)
TOKEN_MEAN_TASKS = ("token_classification",)
MICRO4_OF_8 = ("--micro-batch-size", "4", "--global-batch-size", "8")


def losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


def final_eval(out_dir) -> dict:
    last = read_metrics(out_dir)[max(read_metrics(out_dir))]
    return {k[5:]: v for k, v in last.items() if k.startswith("eval_")}


@pytest.fixture(scope="module")
def one_process(accelerate_files, tmp_path_factory):
    """Every task on one process (global batch 8): the output directory of each."""
    root = tmp_path_factory.mktemp("one_process")
    dist.setup_dist_util({})
    for task in TASKS:
        assert cli.main(task_argv(accelerate_files, task, root / task)) == 0
    for task in TOKEN_MEAN_TASKS:  # the dp2 runs' micro-batches, one after the other
        argv = task_argv(accelerate_files, task, root / f"{task}-micro4", *MICRO4_OF_8)
        assert cli.main(argv) == 0
    return root


@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_trains_on_one_process(accelerate_files, one_process, task):
    out = one_process / task
    got = losses(out)
    assert len(got) == 12 and all(math.isfinite(v) for v in got)
    assert sum(got[-3:]) < sum(got[:3]), got  # it learns
    assert METRICS[task] in final_eval(out), final_eval(out)
    model_dir = accelerate_files[TASKS[task][0]]
    assert_export_is_the_trained_model(task, model_dir, out)
    # the tokenizer went along: transformers reads it back and encodes as the model's own
    text = "the quick brown fox, twice: the quick brown fox"
    saved = transformers.AutoTokenizer.from_pretrained(out / "hf")
    assert (
        saved(text)["input_ids"]
        == transformers.AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]
    )


def assert_export_is_the_trained_model(task, model_dir, out) -> None:
    """The Hugging Face directory the run wrote holds what it trained: its final checkpoint
    loaded into a fresh model. A transformers module (zeroed first, so every weight must come
    from the checkpoint) gives the exported model's logits; a zoo model, re-exported on one
    process, gives the exported weights bit for bit."""
    from libai.accelerate.models import HFTaskModel, model_type_of, zoo_class_name
    from libai.checkpoint.checkpointer import Checkpointer

    dist.setup_dist_util({})
    auto = getattr(transformers, cli.get_task(task).auto_model)
    exported = auto.from_pretrained(out / "hf").eval()
    name = zoo_class_name(task, model_type_of(str(model_dir)))
    if name is None:
        trained = HFTaskModel(auto.from_pretrained(out / "hf"))
        with torch.no_grad():
            for p in trained.parameters():
                p.zero_()
        Checkpointer(trained, str(out)).load(str(out / "model_final"), [])
        ids = torch.randint(5, 50, (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            want, got = trained.eval()(input_ids=ids), exported(input_ids=ids)
        assert want and set(got.keys()) >= set(want), (sorted(got.keys()), sorted(want))
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=key)
        return
    import libai.models
    from libai.models.utils import load_huggingface, save_huggingface

    trained = load_huggingface(str(model_dir), getattr(libai.models, name))
    Checkpointer(trained, str(out)).load(str(out / "model_final"), [])
    save_huggingface(trained, str(out / "reference"))
    want = load_file(str(out / "reference" / "model.safetensors"))
    written = {
        k: v for p in (out / "hf").glob("*.safetensors") for k, v in load_file(str(p)).items()
    }
    assert sorted(written) == sorted(want)
    for key, value in want.items():
        assert torch.equal(written[key], value), key
    # and transformers reads it (checked above: ``exported`` loaded) as the same weights
    reloaded = auto.from_pretrained(out / "reference").state_dict()
    for key, value in exported.state_dict().items():
        assert torch.equal(reloaded[key], value), key


def test_data_parallel_tensor_and_pipeline_parallel_runs(accelerate_files, one_process, tmp_path):
    """One launch of 2 ranks: every task on dp2, DistilBERT (outside the zoo) with dp2 +
    ZeRO-2, the zoo's BERT with ZeRO-3, and the zoo's BERT on tp2 and pp2; each equals one
    process on the same global batches (losses at every step, the final metric)."""
    f = accelerate_files
    half = ["--micro-batch-size", "4"]  # x 2 dp ranks: one process's global batch of 8
    runs = [
        {"kind": "cli", "name": f"dp2-{t}", "argv": task_argv(f, t, tmp_path / f"dp2-{t}", *half)}
        for t in TASKS
    ]
    runs.append(
        {
            "kind": "cli",
            "name": "distilbert-zero2",
            "argv": task_argv(
                f,
                "sequence_classification",
                tmp_path / "zero2",
                *half,
                "--zero-2-memory-optimization",
            ),
        }
    )
    bert = dict(model="bert", steps=8)
    layouts = {
        "tp2": ["--tensor-model-parallel-size", "2"],
        "pp2": [
            "--pipeline-model-parallel-size",
            "2",
            "--global-batch-size",
            "8",
            "--micro-batch-size",
            "4",
        ],
        # the zoo's model sharded by FSDP2 (ZeRO-3), written back to HF format
        "zero3": [*half, "--zero-3-memory-optimization"],
    }
    for name, flags in layouts.items():
        argv = task_argv(f, "sequence_classification", tmp_path / name, **bert) + flags
        runs.append({"kind": "cli", "name": name, "argv": argv})
    results = torchrun("accelerate_runs.py", 2, json.dumps(runs), timeout=900)
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    for t in TASKS:  # the losses and the metric over the dp ranks' shares: one process's
        dp2 = tmp_path / f"dp2-{t}"
        one = one_process / (f"{t}-micro4" if t in TOKEN_MEAN_TASKS else t)
        assert losses(dp2) == pytest.approx(losses(one), abs=LOSS_TOL), t
        assert final_eval(dp2) == pytest.approx(final_eval(one), rel=1e-5), t
    zero2 = tmp_path / "zero2"
    assert losses(zero2) == pytest.approx(
        losses(one_process / "sequence_classification"), abs=LOSS_TOL
    )
    # the zoo model on tp2 / pp2 / ZeRO-3 equals one process
    dist.setup_dist_util({})
    assert cli.main(task_argv(f, "sequence_classification", tmp_path / "one", **bert)) == 0
    one = losses(tmp_path / "one")
    for name in layouts:
        assert losses(tmp_path / name) == pytest.approx(one, abs=LOSS_TOL), name
        if name != "pp2":  # under pp the black box reports the evaluation loss only
            want = final_eval(tmp_path / "one")
            assert final_eval(tmp_path / name) == pytest.approx(want, rel=1e-5), name
    # each layout wrote back exactly what it trained: its final checkpoint, exported on one
    # process
    from libai.checkpoint.checkpointer import Checkpointer
    from libai.models import BertForClassification
    from libai.models.utils import load_huggingface, save_huggingface

    for name in layouts:
        dist.setup_dist_util({})
        trained = load_huggingface(str(tmp_path / "one" / "hf"), BertForClassification)
        Checkpointer(trained, str(tmp_path / name)).load(str(tmp_path / name / "model_final"), [])
        save_huggingface(trained, str(tmp_path / f"reference-{name}"))
        want = load_file(str(tmp_path / f"reference-{name}" / "model.safetensors"))
        files = sorted((tmp_path / name / "hf").glob("*.safetensors"))
        # tp2 / ZeRO-3: one file (their ranks share one stage); pp2: one per stage
        assert len(files) == (2 if name == "pp2" else 1), files
        written = {k: v for path in files for k, v in load_file(str(path)).items()}
        assert sorted(written) == sorted(want)
        assert all(torch.equal(written[k], want[k]) for k in want), name
        hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / name / "hf")
        state = hf.state_dict()
        assert all(torch.equal(state[k], want[k]) for k in want), name


def test_load_resumes_the_black_box_exactly(accelerate_files, tmp_path):
    f = accelerate_files
    common = ["--save-interval", "3", "--eval-interval", "1000"]
    argv = task_argv(f, "sequence_classification", tmp_path / "straight", *common, steps=6)
    assert cli.main(argv) == 0
    argv = task_argv(f, "sequence_classification", tmp_path / "first", *common, steps=3)
    assert cli.main(argv) == 0
    argv = task_argv(f, "sequence_classification", tmp_path / "resumed", *common, steps=6)
    assert cli.main([*argv, "--load", str(tmp_path / "first" / "model_0000002")]) == 0
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4, 5]
    for i in (3, 4, 5):
        assert resumed[i]["total_loss"] == straight[i]["total_loss"], i


# ---- bad input -------------------------------------------------------------------------------
def run_main(argv, monkeypatch):
    """``cli.main(argv)`` that fails the test if the mesh (a collective) is created."""

    def no_mesh(*args, **kwargs):
        raise AssertionError("the mesh was created before the input was checked")

    monkeypatch.setattr(dist, "setup_dist_util", no_mesh)
    return cli.main(argv)


def test_bad_input_is_refused_before_any_collective(accelerate_files, tmp_path, monkeypatch):
    f = accelerate_files
    base = task_argv(f, "sequence_classification", tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # Hub ids: only what the cache holds
    with pytest.raises(
        FileNotFoundError,
        match="'bert-base-uncased' is neither a local model directory nor a Hub model in the "
        "Hugging Face cache",
    ):
        run_main([*base, "--pretrained-model-name-or-path", "bert-base-uncased"], monkeypatch)
    with pytest.raises(FileNotFoundError, match="--data-path 'missing/train.csv': no such"):
        run_main([*base, "--data-path", "missing/train.csv"], monkeypatch)
    hub_id = ["--data-path", "no-such-org/glue", "--data-name", "mrpc"]  # not in any cache
    with pytest.raises(
        ValueError, match="--data-path no-such-org/glue --data-name mrpc: datasets.load_dataset"
    ):
        run_main([*base, *hub_id], monkeypatch)
    with pytest.raises(ValueError, match="column 'sentence3' not found.*columns found"):
        run_main([*base, "--text-columns", "sentence1,sentence3"], monkeypatch)
    with pytest.raises(ValueError, match="contradict each other"):
        run_main([*base, "--zero-1-memory-optimization", "--fsdp-memory-optimization"], monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ValueError,
        match="--global-batch-size 20 is not divisible by --micro-batch-size 8 x 2 "
        "data-parallel ranks",
    ):
        run_main([*base, "--global-batch-size", "20"], monkeypatch)
    with pytest.raises(
        ValueError,
        match="sequence_classification on model_type 'distilbert' is not one. Supported:",
    ):
        run_main([*base, "--tensor-model-parallel-size", "2"], monkeypatch)
    with pytest.raises(SystemExit):  # argparse: invalid choice, exit status 2
        run_main([*base, "--task", "summarization"], monkeypatch)
    # Megatron's names for context and expert parallel: known flags; context parallel above 1
    # refused (the HF models run their own attention), expert parallel on a dense model
    with pytest.raises(
        ValueError, match=r"--context-parallel-size 2: .* Use --context-parallel-size 1$"
    ):
        run_main([*base, "--context-parallel-size", "2"], monkeypatch)
    with pytest.raises(
        ValueError,
        match=r"--expert-model-parallel-size 2 splits the experts .* sequence_classification "
        r"on model_type 'distilbert' has none. Use --expert-model-parallel-size 1$",
    ):
        run_main([*base, "--expert-model-parallel-size", "2"], monkeypatch)
    with pytest.raises(ValueError, match=r"--moe-aux-loss-coeff must be >= 0"):
        run_main([*base, "--moe-aux-loss-coeff", "-1"], monkeypatch)
    with pytest.raises(ValueError, match="--context-parallel-size must be >= 1"):
        run_main([*base, "--context-parallel-size", "0"], monkeypatch)


def test_the_command_line_exits_non_zero_with_one_line(accelerate_files, tmp_path):
    env = {**train_env(), "PORT": str(free_port())}
    base = task_argv(accelerate_files, "sequence_classification", tmp_path)
    tool = str(ROOT / "tools" / "libai_accelerate.py")
    cmd = [
        "bash",
        str(ROOT / "tools" / "train.sh"),
        tool,
        "-",
        "2",
        *base,
        "--tensor-model-parallel-size",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode != 0
    assert "error: ValueError: --tensor-model-parallel-size 2" in proc.stderr
    assert "Starting training" not in proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, tool, "--task", "nope"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and "invalid choice: 'nope'" in proc.stderr
    # the console script pip installs
    script = os.path.join(os.path.dirname(sys.executable), "libai-accelerate")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--zero-1-memory-optimization" in proc.stdout


def test_a_mixtral_fine_tunes_with_expert_parallel(accelerate_files, tmp_path):
    """An unmodified Hugging Face Mixtral through the black box with Megatron's flags:
    ``--expert-model-parallel-size 2 --moe-aux-loss-coeff 0.02`` on 2 ranks (two experts
    each) equals one process on the same global batches (losses with the balancing term,
    the final perplexity), and the exported directory holds the trained weights and the
    coefficient."""
    f = accelerate_files
    moe = ["--moe-aux-loss-coeff", "0.02"]
    dist.setup_dist_util({})
    one = task_argv(f, "causal_lm", tmp_path / "one", *moe, model="mixtral", steps=6)
    assert cli.main(one) == 0
    ep2 = task_argv(
        f, "causal_lm", tmp_path / "ep2", *moe, "--expert-model-parallel-size", "2",
        model="mixtral", steps=6, micro=4,
    )  # fmt: skip
    results = torchrun(
        "accelerate_runs.py", 2, json.dumps([{"kind": "cli", "name": "ep2", "argv": ep2}])
    )
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    assert losses(tmp_path / "ep2") == pytest.approx(losses(tmp_path / "one"), abs=LOSS_TOL)
    assert final_eval(tmp_path / "ep2") == pytest.approx(final_eval(tmp_path / "one"), rel=1e-5)
    metrics = read_metrics(tmp_path / "ep2")
    assert all(m["moe_aux_loss"] > 0 for m in metrics.values())  # logged as its own term
    config = json.loads((tmp_path / "ep2" / "hf" / "config.json").read_text())
    assert config["router_aux_loss_coef"] == 0.02 and config["output_router_logits"]
    assert_export_is_the_trained_model("causal_lm", f["mixtral"], tmp_path / "ep2")


def test_lora_fine_tunes_with_peft_flags_and_exports_the_adapter_or_the_merge(
    accelerate_files, tmp_path
):
    """Rapidformer's black box with ``--lora-r 4 --lora-target-modules c_attn,c_proj``: the
    run writes a PEFT adapter directory that ``peft`` loads onto the untouched GPT-2; the
    same run with ``--merge-lora`` writes the merged model, with the same logits; LoRA
    flags without ``--lora-r``, or on a model outside the zoo, are refused in one line."""
    peft = pytest.importorskip("peft")
    f = accelerate_files
    lora = ["--lora-r", "4", "--lora-target-modules", "c_attn,c_proj", "--seed", "3"]
    dist.setup_dist_util({})
    assert cli.main(task_argv(f, "causal_lm", tmp_path / "adapter", *lora, steps=4)) == 0
    assert (
        cli.main(task_argv(f, "causal_lm", tmp_path / "merged", *lora, "--merge-lora", steps=4))
        == 0
    )
    assert (tmp_path / "adapter" / "hf" / "adapter_config.json").is_file()
    settings = json.loads((tmp_path / "adapter" / "hf" / "adapter_config.json").read_text())
    assert settings["r"] == 4 and settings["lora_alpha"] == 8.0
    assert sorted(settings["target_modules"]) == ["c_attn", "c_proj"]
    x = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    base = transformers.AutoModelForCausalLM.from_pretrained(f["gpt2"]).eval()
    with torch.no_grad():
        plain = base(x).logits
        adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter" / "hf").eval()(x).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "hf")
        assert (adapted - plain).abs().max() > 1e-4  # the adapters trained
        torch.testing.assert_close(merged.eval()(x).logits, adapted, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="--lora-alpha needs --lora-r"):
        cli.main(task_argv(f, "causal_lm", tmp_path / "x", "--lora-alpha", "8"))
    with pytest.raises(ValueError, match="LoRA runs on the zoo's models"):
        cli.main(task_argv(f, "sequence_classification", tmp_path / "y", "--lora-r", "2"))
