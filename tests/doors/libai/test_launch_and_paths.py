"""The launchers and tools as a user meets them: whose ``projects/`` a tool imports from the
user's working directory, which port ``tools/train.sh`` / ``tools/infer.sh`` rendezvous on, and
what a cut or corrupt ``.idx`` file says."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launch import free_port
from train_net_helpers import ROOT, TINY, TRAIN_NET, TRAIN_SH, read_metrics, train_env

from libai.data.data_utils.indexed_dataset import MMapIndexedDataset, make_builder

TOOLS = ROOT / "tools"
INFER_SH = TOOLS / "infer.sh"

# ---- sys.path: the user's working directory first ------------------------------------------------

#: a config that imports the user's own projects.text_classification (a ``modeling`` package,
#: where ours is a module) and this checkout's projects.chat_sft, records where both came from,
#: and stops the tool: nothing else is needed to see which files a tool imports
PROBE_CONFIG = """
import json
import os

import projects.chat_sft
from projects.text_classification.modeling import heads

with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"heads": heads.__file__, "marker": heads.USER_ONLY, "chat_sft": projects.chat_sft.__file__}, f)
raise SystemExit(0)
"""

#: each tool that loads a user's LazyConfig, with the arguments that make it load probe.py
CONFIG_TOOLS = {
    "train_net": ["train_net.py", "--config-file", "probe.py"],
    "export_onnx": ["export_onnx.py", "--model-path", "ckpt", "--config-file", "probe.py"]
    + ["--output", "out.onnx"],
    "convert_checkpoint": ["convert_checkpoint.py", "to-hf", "--checkpoint", "ckpt"]
    + ["--config-file", "probe.py", "--output", "hf"],
    "align": ["align.py", "--base", "libai:probe.py", "--raw", "libai:probe.py"],
}


@pytest.mark.parametrize("tool", sorted(CONFIG_TOOLS))
def test_user_projects_in_the_working_directory_win_over_ours(tmp_path, tool):
    """A user's ``projects/text_classification`` under the working directory is the one a
    config imports (ours has no ``modeling`` package: 'projects.text_classification.modeling'
    is not a package), and this checkout's ``projects/`` still provides the rest."""
    package = tmp_path / "projects" / "text_classification" / "modeling"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "heads.py").write_text("USER_ONLY = 'the user heads'\n")
    (tmp_path / "probe.py").write_text(PROBE_CONFIG)
    out = tmp_path / "probe.json"
    script, *args = CONFIG_TOOLS[tool]
    proc = subprocess.run(
        [sys.executable, str(TOOLS / script), *args],
        cwd=tmp_path,
        env=train_env(PROBE_OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.exists(), f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    found = json.loads(out.read_text())
    assert found["heads"] == str(package / "heads.py") and found["marker"] == "the user heads"
    assert found["chat_sft"] == str(ROOT / "projects" / "chat_sft" / "__init__.py")


# ---- the launchers' port ---------------------------------------------------------------------------

#: stands in for a training / inference script: every rank writes what torchrun gave it
#: (after waiting, if PROBE_WAIT_FOR names a file, until that file exists)
PROBE_SCRIPT = """
import json, os, sys, time

out = os.environ["PROBE_DIR"]
rank = os.environ["RANK"]
env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
    json.dump({**env, "argv": sys.argv[1:]}, f)
os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))
other = os.environ.get("PROBE_WAIT_FOR")
deadline = time.time() + 60
while other and not os.path.exists(other):
    if time.time() > deadline:
        sys.exit(f"{other} never appeared")
    time.sleep(0.05)
"""


def launcher_env(**extra) -> dict:
    """train_env() less the caller's PORT / NODE / NODE_RANK / ADDR, plus ``extra``."""
    env = train_env()
    for name in ("PORT", "NODE", "NODE_RANK", "ADDR"):
        env.pop(name, None)
    return {**env, **extra}


def launch(launcher: Path, probe: Path, nproc: int, env: dict) -> subprocess.Popen:
    """``bash tools/train.sh PROBE CONFIG NPROC x=1`` or ``bash tools/infer.sh PROBE NPROC x=1``."""
    args = (
        [str(probe), "config.py", str(nproc)] if launcher == TRAIN_SH else [str(probe), str(nproc)]
    )
    return subprocess.Popen(
        ["bash", str(launcher), *args, "x=1"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ranks(out_dir: Path, world: int) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture
def probe(tmp_path) -> Path:
    path = tmp_path / "probe_script.py"
    path.write_text(PROBE_SCRIPT)
    return path


@pytest.mark.parametrize("launcher", [TRAIN_SH, INFER_SH], ids=["train.sh", "infer.sh"])
def test_two_single_node_jobs_without_port_run_side_by_side(tmp_path, probe, launcher):
    """No PORT, one node: each job rendezvous on a free port of its own; the two jobs overlap
    (each one's rank 0 waits for the other's) and both finish."""
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        out.mkdir()
    procs = [
        launch(launcher, probe, 2, launcher_env(PROBE_DIR=str(out), PROBE_WAIT_FOR=str(other)))
        for out, other in zip(outs, [outs[1] / "rank0.json", outs[0] / "rank0.json"])
    ]
    results = [p.communicate(timeout=180) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    ports = [{r["MASTER_PORT"] for r in ranks(out, 2)} for out in outs]
    assert all(len(p) == 1 for p in ports) and ports[0] != ports[1], ports
    args = ["--config-file", "config.py", "x=1"] if launcher == TRAIN_SH else ["x=1"]
    assert ranks(outs[0], 2)[1]["argv"] == args


@pytest.mark.parametrize("launcher", [TRAIN_SH, INFER_SH], ids=["train.sh", "infer.sh"])
def test_an_explicit_port_is_the_port_used(tmp_path, probe, launcher):
    port = free_port()
    proc = launch(launcher, probe, 2, launcher_env(PROBE_DIR=str(tmp_path), PORT=str(port)))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"{stdout[-2000:]}\n{stderr[-4000:]}"
    assert {r["MASTER_PORT"] for r in ranks(tmp_path, 2)} == {str(port)}


@pytest.mark.parametrize("launcher", [TRAIN_SH, INFER_SH], ids=["train.sh", "infer.sh"])
def test_an_explicit_port_in_use_is_not_replaced(tmp_path, probe, launcher):
    """PORT names a port somebody listens on: the job fails to bind it, rather than quietly
    moving elsewhere (a multi-node job's other nodes would wait on PORT forever)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = launch(launcher, probe, 2, launcher_env(PROBE_DIR=str(tmp_path), PORT=str(port)))
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not list(tmp_path.glob("rank*.json"))
    assert "EADDRINUSE" in stderr and f"port: {port}" in stderr, stderr[-3000:]


@pytest.mark.parametrize("launcher", [TRAIN_SH, INFER_SH], ids=["train.sh", "infer.sh"])
def test_two_nodes_meet_on_addr_and_port(tmp_path, probe, launcher):
    """NODE=2: each launcher is one node of 1 process, rendezvousing on ADDR:PORT."""
    port = free_port()
    procs = [
        launch(
            launcher,
            probe,
            1,
            launcher_env(
                PROBE_DIR=str(tmp_path),
                NODE="2",
                NODE_RANK=str(rank),
                ADDR="127.0.0.1",
                PORT=str(port),
            ),
        )
        for rank in (0, 1)
    ]
    results = [p.communicate(timeout=180) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    found = ranks(tmp_path, 2)
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"], r["WORLD_SIZE"]) for r in found} == {
        ("127.0.0.1", str(port), "2")
    }


def test_two_training_jobs_without_port_on_one_node(sample_env, tmp_path):
    """Two ``tools/train.sh`` trainings on 2 processes each, started together with no PORT in
    the environment (they used to meet on 12345: EADDRINUSE): both finish."""
    env = {k: v for k, v in sample_env.items() if k not in ("PORT", "NODE", "NODE_RANK", "ADDR")}
    opts = [*TINY, "train.train_iter=3", "train.evaluation.enabled=False"]
    cfg = str(ROOT / "configs" / "gpt2_pretrain.py")
    procs, outs = [], [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        cmd = ["bash", str(TRAIN_SH), str(TRAIN_NET), cfg, "2", *opts, f"train.output_dir={out}"]
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    results = [p.communicate(timeout=400) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-2000:]}\n{stderr[-6000:]}"
    for out in outs:
        assert max(read_metrics(out)) == 2


# ---- a cut or corrupt .idx ---------------------------------------------------------------------------


@pytest.fixture
def index_bytes(tmp_path) -> tuple[str, bytes]:
    """A valid prefix (3 documents, 4 sequences) and its .idx bytes."""
    prefix = str(tmp_path / "corpus")
    builder = make_builder(prefix + ".bin", vocab_size=1000)
    rng = np.random.RandomState(0)
    for doc in range(3):
        for _ in range(1 + doc % 2):
            builder.add_item(rng.randint(0, 1000, size=rng.randint(2, 9)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix, Path(prefix + ".idx").read_bytes()


def _error(prefix: str, idx: bytes) -> str:
    Path(prefix + ".idx").write_bytes(idx)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    message = str(e.value)
    assert "\n" not in message and prefix + ".idx" in message, message
    return message


@pytest.mark.parametrize(
    "cut, field, into",
    [(7, "magic", 7), (9, "version", 0), (12, "version", 3), (17, "dtype code", 0)]
    + [(18, "sequence count", 0), (22, "sequence count", 4), (29, "document count", 3)],
)
def test_an_idx_cut_inside_its_header_says_where(index_bytes, cut, field, into):
    prefix, idx = index_bytes
    message = _error(prefix, idx[:cut])
    assert f"is truncated: its header ends after {cut} of 34 bytes" in message, message
    assert f"{into} of " in message and f"into the {field} field" in message, message
    assert f"(read {idx[:cut]!r})" in message, message


def test_an_empty_idx_says_so(index_bytes):
    prefix, _ = index_bytes
    assert "corpus.idx is empty" in _error(prefix, b"")


def test_an_idx_cut_inside_its_arrays_says_which(index_bytes):
    prefix, idx = index_bytes
    sequences, documents = struct.unpack("<QQ", idx[18:34])
    assert (sequences, documents) == (4, 4) and len(idx) == 34 + 4 * 12 + 4 * 8
    for cut, where in [
        (34 + 6, "it ends 6 of 16 bytes into the sizes array"),
        (34 + 16 + 11, "it ends 11 of 32 bytes into the pointers array"),
        (34 + 48 + 8, "it ends 8 of 32 bytes into the doc_idx array"),
    ]:
        message = _error(prefix, idx[:cut])
        assert f"is {cut} bytes but its header announces 4 sequences" in message, message
        assert "truncated or corrupt" in message and where in message, message
    message = _error(prefix, idx + b"\0" * 3)
    assert "3 bytes follow the doc_idx array" in message


def test_a_corrupt_idx_header_shows_what_differs(index_bytes):
    prefix, idx = index_bytes
    flipped = idx[:3] + bytes([idx[3] ^ 0x20]) + idx[4:]  # MMIDIDX -> MMIdIDX
    message = _error(prefix, flipped)
    assert "is not a Megatron mmap index file" in message
    assert f"starts with {flipped[:9]!r} where {idx[:9]!r} was expected" in message, message
    assert "first difference at byte 3: found b'd', expected b'D'" in message, message
    # the magic cut short and wrong: still the difference, not "truncated"
    message = _error(prefix, b"MMX")
    assert "first difference at byte 2: found b'X', expected b'I'" in message, message
    version = idx[:9] + struct.pack("<Q", 7) + idx[17:]
    assert "unsupported index version 7 (expected 1)" in _error(prefix, version)
    code = idx[:17] + bytes([42]) + idx[18:]
    assert "unknown dtype code 42" in _error(prefix, code)
    counts = idx[:18] + struct.pack("<Q", 10**12) + idx[26:]
    message = _error(prefix, counts)
    assert "header announces 1000000000000 sequences" in message
    assert f"it ends {len(idx) - 34} of 4000000000000 bytes into the sizes array" in message


def test_a_cut_bin_names_both_files(index_bytes):
    prefix, idx = index_bytes
    data = Path(prefix + ".bin").read_bytes()
    Path(prefix + ".bin").write_bytes(data[:-3])
    message = _error(prefix, idx)
    assert prefix + ".bin" in message and "truncated" in message, message
    Path(prefix + ".bin").write_bytes(data)
    assert len(MMapIndexedDataset(prefix)) == 4  # the fixture's files are fine as written
