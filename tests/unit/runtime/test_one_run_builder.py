"""Every front door builds its run through :class:`libai.runtime.run.Run`: none of them
parallelizes, shards the optimizer, builds the checkpointer, resumes or builds the loop by
itself. The scan reads the doors' source (no import, no process group)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOORS = ("libai/engine", "libai/fleetx", "libai/accelerate")

#: the run's sequence: only :class:`~libai.runtime.run.Run` calls these
RUN_STEPS = {
    "parallelize": "parallelizes",
    "build_runner": "parallelizes",
    "ModelRunner": "parallelizes",
    "prepare_model": "shards the model (ZeRO-3)",
    "shard_optimizer_for": "shards the optimizer",
    "shard_optimizer": "shards the optimizer",
    "build_checkpointer": "builds the checkpointer",
    "Checkpointer": "builds the checkpointer",
    "load_to_resume": "resumes",
    "resume_point": "resumes",
    "build_step": "builds the loop",
    "build_training_loop": "builds the loop",
    "position_loader": "builds the loop",
    "seed_this_rank": "seeds the ranks",
}
#: ``<...>.checkpointer.<method>(...)``: loading through the checkpointer is resuming
CHECKPOINTER_LOADS = {"load", "resume_or_load"}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def run_steps_taken(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each step of the run's sequence ``source`` takes itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _called_name(node)
        if name in RUN_STEPS:
            found.append((node.lineno, f"{RUN_STEPS[name]} ({name})"))
        elif name in CHECKPOINTER_LOADS and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            owner = receiver.attr if isinstance(receiver, ast.Attribute) else None
            owner = receiver.id if isinstance(receiver, ast.Name) else owner
            if owner == "checkpointer":
                found.append((node.lineno, f"resumes (checkpointer.{name})"))
    return found


def door_files() -> list[Path]:
    files = [p for door in DOORS for p in sorted((ROOT / door).rglob("*.py"))]
    assert len(files) > 20, files  # the scan sees the doors
    return files


def test_no_door_takes_a_step_of_the_run_itself():
    offences = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in door_files()
        for line, what in run_steps_taken(path.read_text())
    ]
    assert not offences, "a door builds part of the run itself (use libai.runtime.run.Run):\n" + (
        "\n".join(offences)
    )


@pytest.mark.parametrize(
    "snippet, what",
    [
        ("parts = parallelize(model, spec)", "parallelizes (parallelize)"),
        ("opt = core.shard_optimizer_for(parts, opt)", "shards the optimizer"),
        ("c = Checkpointer(model, out)", "builds the checkpointer"),
        ("self.checkpointer.resume_or_load(None)", "resumes (checkpointer.resume_or_load)"),
        ("checkpointer.load(path)", "resumes (checkpointer.load)"),
        ("t = build_training_loop(parts, spec, loader)", "builds the loop"),
    ],
)
def test_the_scan_catches_each_step(snippet, what):
    """The scan is not vacuous: each step written by hand is reported."""
    found = run_steps_taken(snippet)
    assert len(found) == 1 and what in found[0][1], found


def test_the_scan_lets_the_run_be_used():
    source = (
        "run = Run(model, spec, optimizer_fn=f)\n"
        "run.load(path)\n"
        "self.run.resume_or_load(weights)\n"
        "self.model.load_state_dict(sd)\n"
    )
    assert run_steps_taken(source) == []


def test_every_door_builds_a_run():
    """Each door's module names :class:`Run` (the scan above alone would pass a door that
    trained nothing)."""
    for door in ("libai/engine/default.py", "libai/fleetx/engine.py", "libai/accelerate/engine.py"):
        tree = ast.parse((ROOT / door).read_text())
        calls = {_called_name(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "Run" in calls, door
