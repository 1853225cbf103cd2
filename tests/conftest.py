"""Fixtures shared by the test files."""

from __future__ import annotations

import pytest
from train_net_helpers import train_env

from libai.data.sample_corpus import ensure_sample_dataset


@pytest.fixture(scope="session")
def sample_env(tmp_path_factory):
    """A small sample dataset built once per session; the default configs (the LiBai GPT config
    and projects/gpt's YAMLs) find it through the environment variable."""
    data_dir = tmp_path_factory.mktemp("sample_data")
    ensure_sample_dataset(str(data_dir), max_bytes=300_000, vocab_size=1000)
    return train_env(LIBAI_SAMPLE_DATA_DIR=str(data_dir))
