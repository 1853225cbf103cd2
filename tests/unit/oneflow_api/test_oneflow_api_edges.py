"""The edges of libai.oneflow_api: which code counts as project code, the entry-script
runner, placements, the data-only load's message, WarmupLR's arguments and state, and the
cross entropy's reductions on one process (several ranks: tests/distributed)."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from libai.oneflow_api import imports, project_module
from libai.oneflow_api.global_tensors import Placement, _device_of, creation, to_global
from libai.oneflow_api.run import project_dir

flow = project_module("oneflow")


def test_project_code_is_named_projects_or_lives_in_a_registered_directory(tmp_path, monkeypatch):
    assert imports.is_project_code({"__name__": "projects.QQP.modeling.model"})
    assert not imports.is_project_code({"__name__": "projectsX.model"})
    assert not imports.is_project_code({"__name__": "libai.layers", "__file__": "/x/y.py"})
    assert not imports.is_project_code(None)
    root = str(tmp_path / "projects" / "MAE")
    monkeypatch.setattr(imports, "PROJECT_DIRS", [root])
    inside = {"__name__": "modeling.mae", "__file__": os.path.join(root, "modeling", "mae.py")}
    beside = {"__name__": "modeling.mae", "__file__": root + "2/modeling/mae.py"}
    assert imports.is_project_code(inside) and not imports.is_project_code(beside)
    assert not imports.is_project_code({"__name__": "m", "__file__": None})


def test_oneflow_import_answers_project_code_only(monkeypatch):
    project = {"__name__": "projects.demo.model"}
    monkeypatch.setattr(imports, "served", False)
    assert imports.oneflow_import("oneflow", {"__name__": "user"}, (), 0) is None
    assert imports.oneflow_import("oneflow", project, (), 1) is None  # a relative import
    assert imports.oneflow_import("torch", project, (), 0) is None
    assert not imports.served
    assert imports.oneflow_import("oneflow.nn", project, None, 0) is flow  # `import a.b`
    assert imports.oneflow_import("oneflow.nn", project, ("Module",), 0).Module is torch.nn.Module
    assert imports.served
    numpy = imports.oneflow_import("numpy", project, (), 0)
    assert numpy.float is float and numpy.__name__ == "numpy"
    assert imports.oneflow_import("numpy.linalg", project, ("norm",), 0).norm is not None
    assert imports.oneflow_import("numpy.linalg", project, None, 0).float is float


def test_the_persistent_hook_is_installed_once(monkeypatch):
    original = builtins.__import__
    try:
        imports.install_project_imports()
        first = builtins.__import__
        imports.install_project_imports()
        assert builtins.__import__ is first and first is not original
        assert first._libai_oneflow_projects
        globals_ = {"__name__": "projects.demo.model"}
        assert first("oneflow", globals_, None, (), 0) is flow
        assert first("os", globals_, None, (), 0) is os  # everything else: Python's import
    finally:
        builtins.__import__ = original


def test_project_dir_is_the_scripts_projects_entry(tmp_path):
    script = tmp_path / "projects" / "MAE" / "tools" / "train_net.py"
    assert project_dir(str(script)) == str(tmp_path / "projects" / "MAE")
    assert project_dir(str(tmp_path / "projects" / "Llama" / "train_net.py")) == str(
        tmp_path / "projects" / "Llama"
    )
    assert project_dir(str(tmp_path / "scripts" / "run.py")) == str(tmp_path / "scripts")


_RUN = """
import sys
from libai.oneflow_api import run
run.main(sys.argv[1:])
"""


def test_the_runner_runs_a_project_script_as_main(tmp_path):
    project = tmp_path / "projects" / "demo"
    (project / "utils").mkdir(parents=True)
    (project / "utils" / "helper.py").write_text("import oneflow as flow\nNAME = flow.__name__\n")
    (project / "train_net.py").write_text(
        textwrap.dedent(
            """
            import sys
            import numpy as np
            import oneflow as flow
            from utils.helper import NAME
            print("main", __name__, NAME, np.float is float, sys.argv[1:])
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(project / "train_net.py"), "--config-file", "c.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        proc.stdout.strip().splitlines()[-1]
        == "main __main__ oneflow True ['--config-file', 'c.py']"
    )
    missing = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path / "nope.py")], capture_output=True, text=True
    )
    assert missing.returncode != 0 and "no script" in missing.stderr
    usage = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True)
    assert usage.returncode != 0 and "usage" in usage.stderr


def test_placement_records_and_devices(monkeypatch):
    assert Placement("cuda", [0, 1]).ranks == (0, 1) and Placement().type == "cpu"
    assert Placement(torch.device("cpu")).type == "cpu"
    assert Placement("cpu", device="cpu").torch_device() == torch.device("cpu")
    assert Placement("cpu").torch_device() == torch.device("cpu")
    if not torch.cuda.is_available():
        assert Placement("cuda").torch_device() == torch.device("cpu")  # no GPU here
    assert _device_of(None, "cpu") == "cpu"
    assert _device_of(Placement("cpu", device="cpu"), None) == torch.device("cpu")
    assert flow.tensor([1], placement="cpu").device == torch.device("cpu")


def test_creation_on_one_rank_ignores_the_sbp():
    ones = creation(torch.ones)
    assert ones(2, sbp=[flow.sbp.split(0)], placement=None).tolist() == [1.0, 1.0]
    assert flow.zeros(3, dtype=flow.long, sbp=flow.sbp.broadcast).dtype == torch.int64
    assert to_global(torch.ones(2), placement=Placement("cpu"), sbp=flow.sbp.broadcast).sum() == 2


def test_env_names():
    assert flow.env.get_rank() == 0 and flow.env.get_world_size() == 1
    assert flow.env.get_local_rank() == 0 and flow.env.get_node_size() == 1


def test_load_refusal_names_the_file_and_the_object(tmp_path):
    path = tmp_path / "objects.pt"
    torch.save({"x": Placement("cpu")}, path)
    with pytest.raises(ValueError) as err:
        flow.load(path)
    message = str(err.value)
    assert message.startswith(f"oneflow.load({str(path)!r}): the file holds Python objects")
    assert "Placement" in message and "\n" not in message
    with pytest.raises(FileNotFoundError):
        flow.load(tmp_path / "missing.pt")
    torch.save(torch.arange(3), tmp_path / "t.pt")
    assert flow.load(tmp_path / "t.pt", map_location="cpu").tolist() == [0, 1, 2]


def test_sbp_and_placement_classes():
    from torch.distributed.tensor import Placement as DTensorPlacement

    assert flow.sbp.sbp is DTensorPlacement and flow.placement is Placement
    assert flow.placement.all("cpu").ranks == (0,)
    assert not isinstance(flow.placement("cpu", [0]), DeviceMesh)


def test_cross_entropy_reductions_on_one_process_are_torchs():
    logits, labels = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    for reduction in ("sum", "none", "mean"):
        torch.testing.assert_close(
            flow._C.cross_entropy(logits, labels, reduction=reduction),
            F.cross_entropy(logits, labels, reduction=reduction),
        )
    loss = flow.nn.CrossEntropyLoss(reduction="sum", ignore_index=2)
    torch.testing.assert_close(
        loss(logits, labels), F.cross_entropy(logits, labels, reduction="sum", ignore_index=2)
    )


def test_warmup_lr_arguments_and_state():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="scheduler_or_optimizer must be an LR scheduler"):
        flow.optim.lr_scheduler.WarmupLR(object())
    with pytest.raises(ValueError, match="needs warmup_iters > 0"):
        flow.optim.lr_scheduler.WarmupLR(opt, warmup_iters=0)
    inner = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    plain = flow.optim.lr_scheduler.WarmupLR(inner, warmup_iters=0)  # no warmup: the inner's
    assert plain.get_last_lr() == pytest.approx([0.1])
    state = plain.state_dict()
    assert "optimizer" not in state and state["inner"]["step_size"] == 1
    assert state["warmup_factor"] == pytest.approx(1 / 3) and state["warmup_prefix"] is False
    lambda_inner = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (t + 1))
    wrapped = flow.optim.lr_scheduler.WarmupLR(lambda_inner, warmup_factor=0.5, warmup_iters=2)
    lrs = []
    for _ in range(4):
        lrs.append(wrapped.get_last_lr()[0])
        opt.step()
        wrapped.step()
    # the lambda scheduler has no closed form of its own: its get_lr at the step
    assert lrs == pytest.approx([0.05, 0.1 * (0.5 + (1 / 3 - 0.5) * 0.5), 0.1 / 3, 0.1 / 4])
    assert lambda_inner.last_epoch == 0  # read, never stepped
