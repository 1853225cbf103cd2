"""Setting up and resuming a run, the steps every front door shares (libai.runtime.setup,
libai.runtime.resume), on one process: the seed reaches every generator, the output
directory, log file and door config appear, and a resume loads what the path names and
continues after the saved iteration (a weights-only load restores no optimizer state)."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from libai import dist
from libai.checkpoint import Checkpointer
from libai.runtime.resume import ResumePoint, load_to_resume
from libai.runtime.setup import setup_run


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_setup_run_seeds_every_generator_and_writes_the_output_dir(tmp_path):
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    want = draws()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    out = tmp_path / "run"
    saved = []
    util = setup_run({}, str(out), seed=5, save_config=lambda: saved.append(os.listdir(out)))
    got = draws()
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])
    assert util is dist.get_dist_util() and util.layout.world_size == 1
    # the output dir and its log exist when the door saves its config there
    assert saved == [["log.txt"]]
    # another seed, other draws
    setup_run({}, str(out), seed=6)
    assert draws()[0] != want[0]


def test_setup_run_refuses_a_layout_the_world_cannot_hold_before_anything(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        setup_run({"tensor_parallel_size": 2}, str(out), seed=0)
    assert not out.exists()


def make(seed):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def step(model, optimizer):
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("name_the_checkpoint", [False, True])
def test_load_to_resume_continues_after_the_saved_iteration(tmp_path, name_the_checkpoint):
    dist.setup_dist_util({})
    model, optimizer = make(0)
    step(model, optimizer)
    Checkpointer(model, str(tmp_path), optimizer=optimizer).save(
        "model_0000006", iteration=6, consumed_train_samples=56
    )
    path = str(tmp_path / "model_0000006") if name_the_checkpoint else str(tmp_path)

    other, other_opt = make(1)
    point = load_to_resume(Checkpointer(other, optimizer=other_opt), path)
    assert point == ResumePoint(start_iter=7, consumed_train_samples=56)
    assert torch.equal(other.weight, model.weight)
    assert torch.equal(
        other_opt.state[other.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"]
    )

    fresh, fresh_opt = make(2)
    assert load_to_resume(Checkpointer(fresh, optimizer=fresh_opt), path, resume=False) is None
    assert torch.equal(fresh.weight, model.weight) and not fresh_opt.state  # weights only


def test_a_weights_only_checkpoint_gives_no_resume_point(tmp_path):
    dist.setup_dist_util({})
    model, _ = make(0)
    Checkpointer(model, str(tmp_path)).save("weights")
    other, _ = make(1)
    assert load_to_resume(Checkpointer(other), str(tmp_path / "weights")) is None
    assert torch.equal(other.weight, model.weight)
