"""The ``trainer_for`` fixture of LiBai's door tests: builds one-process trainers on the
tiny LM of ``default_trainer_helpers`` and drops the mesh afterwards."""

from __future__ import annotations

import pytest
from default_trainer_helpers import build_trainer

from libai import dist


@pytest.fixture
def trainer_for(tmp_path, monkeypatch):
    """``trainer_for(test_sets, output_dir=None, **options)``: :func:`build_trainer` writing
    under ``tmp_path`` unless told otherwise."""
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])  # configs/ of this checkout

    def build(test_sets, output_dir=None, **options):
        return build_trainer(output_dir or tmp_path, test_sets, **options)

    yield build
    dist.setup_dist_util({})
