"""``libai-serve`` as users run it: one command, its own worker processes on tp2 and pp2,
greedy answers equal to transformers' (so to tp1's), and on SIGTERM the in-flight request
finishes, then a clean exit with the workers gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from server_helpers import Reference, free_port, make_chat_llama_dir

PROMPTS = ["the quick brown fox", "hello", "paris is the capital of"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_chat_llama_dir(tmp_path_factory.mktemp("cli"))


def start(model_dir: str, *flags: str):
    port = free_port()
    command = [sys.executable, "-m", "libai.serving.cli", "--model", model_dir, "--port", str(port)]
    command += ["--device", "cpu", "--block-size", "4", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "the server did not come up"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)


def stop(proc) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return out.decode()


@pytest.mark.parametrize("layout", [["--tensor-parallel-size", "2"], ["-pp", "2"]])
def test_parallel_server_equals_transformers_and_exits_cleanly(model_dir, layout):
    ref = Reference(model_dir)
    proc, url = start(model_dir, *layout)
    try:
        for prompt in PROMPTS:
            body = {"model": model_dir, "prompt": prompt, "max_tokens": 6, "temperature": 0}
            response = httpx.post(url + "/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            want = ref.greedy(ref.tok(prompt)["input_ids"], 6)
            assert response.json()["choices"][0]["text"] == ref.text(want), prompt
        workers = [p for p in _children(proc.pid)]
        assert len(workers) >= 1  # rank 1 runs in its own process
        # SIGTERM while a request streams: it finishes, then the server exits
        body = {"model": model_dir, "prompt": PROMPTS[0], "max_tokens": 30, "stream": True,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    finally:
        log = stop(proc)
    assert proc.returncode == 0, log[-3000:]
    for pid in workers:
        assert not _alive(pid), f"worker {pid} outlived the server"


def test_bad_flags_fail_before_loading(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "libai.serving.cli", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "neither a Hugging Face directory" in out.stderr


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return bool(status.stdout.strip()) and not status.stdout.strip().startswith("Z")


@pytest.mark.parametrize("layout", [["-tp", "2"], ["-pp", "2"]])
def test_parallel_server_serves_adapters_per_request(model_dir, layout, tmp_path):
    """``--lora-modules`` on tp2 (each rank its shard of every adapter, the row-parallel and
    embedding adapters' partial products summed) and pp2 (each stage its layers' adapters):
    every request gets transformers + PEFT's greedy answer for its adapter."""
    pytest.importorskip("peft")
    from serving_models import make_peft_adapter, peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "embed_tokens"]
    sql = make_peft_adapter(model_dir, tmp_path / "sql", 1, r=4, target_modules=targets)
    chat = make_peft_adapter(model_dir, tmp_path / "chat", 2, r=2, target_modules=["up_proj"])
    refs = {
        model_dir: Reference(model_dir),
        "sql": Reference(model_dir),
        "chat": Reference(model_dir),
    }
    refs["sql"].model, refs["chat"].model = peft_model(model_dir, sql), peft_model(model_dir, chat)
    proc, url = start(model_dir, *layout, "--lora-modules", f"sql={sql}", f"chat={chat}")
    try:
        for name, ref in refs.items():
            body = {"model": name, "prompt": PROMPTS[2], "max_tokens": 6, "temperature": 0}
            response = httpx.post(url + "/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            want = ref.greedy(ref.tok(PROMPTS[2])["input_ids"], 6)
            assert response.json()["choices"][0]["text"] == ref.text(want), name
    finally:
        log = stop(proc)
    assert proc.returncode == 0, log[-3000:]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lora-modules", "sql"], "expected NAME=ADAPTER_DIR"),
        (["--lora-modules", "sql=/nonexistent"], "not a PEFT adapter directory"),
        (["--lora-modules", '{"name": "sql"}'], 'JSON needs "name" and "path"'),
    ],
)
def test_bad_lora_modules_fail_before_loading(model_dir, flags, message):
    out = subprocess.run(
        [sys.executable, "-m", "libai.serving.cli", "--model", model_dir, *flags],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]


def test_a_stage_that_cannot_load_stops_every_rank_before_serving(model_dir, tmp_path):
    """pp2 with an adapter for the LM head (a layer LoRA does not adapt here): the last
    stage refuses it while the first has nothing to load; every rank learns it, the first
    stops naming the other's error, and the command exits before serving."""
    pytest.importorskip("peft")
    from serving_models import make_peft_adapter

    head = make_peft_adapter(model_dir, tmp_path / "head", 1, r=2, target_modules=["lm_head"])
    command = [sys.executable, "-m", "libai.serving.cli", "--model", model_dir, "--device", "cpu"]
    command += ["--port", str(free_port()), "-pp", "2", "--lora-modules", f"head={head}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode != 0
    assert "rank 1 failed to load the model" in out.stderr, out.stderr[-3000:]
    assert "'lm_head' matches no Linear or embedding layer" in out.stderr
    assert "Uvicorn running" not in out.stderr + out.stdout
