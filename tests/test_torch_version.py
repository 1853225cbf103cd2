"""The supported PyTorch range: importing libai under a torch older than the floor is a clear
error that names the fix; releases at or above it (with local or pre-release tags) pass."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import libai


@pytest.mark.parametrize(
    "version",
    ["2.10.0", "2.10.0a0+git1234", "2.11.0+cu130", "2.13.0+cpu", "2.14.1", "3.0.0"],
)
def test_supported_versions_pass(version):
    libai.check_torch_version(version)


@pytest.mark.parametrize("version", ["2.9.1+cu126", "2.9.0", "2.8.0", "1.13.1"])
def test_older_versions_are_a_clear_error(version):
    with pytest.raises(
        ImportError, match=rf"needs PyTorch >= 2\.10, but torch {re.escape(version)}.*pip install"
    ):
        libai.check_torch_version(version)


def test_the_installed_torch_is_supported_and_checked_at_import():
    libai.check_torch_version(torch.__version__)
    code = "import torch; torch.__version__ = '2.9.1'; import libai"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "libai needs PyTorch >= 2.10, but torch 2.9.1 is installed" in run.stderr
