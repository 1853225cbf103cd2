"""Fixtures shared by the test files."""

from __future__ import annotations

import os

# One environment for the whole session, set before anything is imported or launched: the
# suite never downloads (the Hugging Face libraries read these at import), and the
# preloaded server that test jobs fork their ranks from (tests/support/forked_ranks.py)
# starts with the environment every later job has -- a variable that code under test sets
# on first use (libai.accelerate sets the offline switches) would otherwise send every
# later job to a fresh interpreter under torchrun.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from train_net_helpers import train_env  # noqa: E402

from libai import dist  # noqa: E402
from libai.data.sample_corpus import ensure_sample_dataset  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def no_home_cache(tmp_path_factory):
    """No test writes into the user's ~/.cache: the sample data directory of this process
    (and of the subprocesses that inherit its environment) is a temporary one; tests that
    need the sample built use :func:`sample_env`."""
    old = os.environ.get("LIBAI_SAMPLE_DATA_DIR")
    os.environ["LIBAI_SAMPLE_DATA_DIR"] = str(tmp_path_factory.mktemp("unbuilt_sample"))
    yield
    if old is None:
        os.environ.pop("LIBAI_SAMPLE_DATA_DIR", None)
    else:
        os.environ["LIBAI_SAMPLE_DATA_DIR"] = old


@pytest.fixture(scope="session")
def sample_env(tmp_path_factory):
    """A small sample dataset built once per session; the default configs (the LiBai GPT config
    and projects/gpt's YAMLs) find it through the environment variable."""
    data_dir = tmp_path_factory.mktemp("sample_data")
    ensure_sample_dataset(str(data_dir), max_bytes=300_000, vocab_size=1000)
    return train_env(LIBAI_SAMPLE_DATA_DIR=str(data_dir))


@pytest.fixture(scope="session")
def accelerate_files(tmp_path_factory):
    """Tiny Hugging Face model directories and data files for every libai.accelerate task."""
    import accelerate_data as data

    root = tmp_path_factory.mktemp("accelerate")
    files = {
        name: getattr(data, f"{name}_dir")(root)
        for name in ("bert", "distilbert", "roberta", "gpt2", "t5", "mixtral")
    }
    files["cls"] = data.classification_csv(root)
    files["ner"] = data.ner_jsonl(root)
    files["qa"] = data.qa_jsonl(root)
    files["text"] = data.text_files(root)
    files["s2s"] = data.seq2seq_jsonl(root)
    files["pretrain"] = data.pretraining_prefix(root, files["gpt2"])
    return files


@pytest.fixture
def own_dist():
    """The pipeline builds its single-process mesh; it is dropped afterwards."""
    yield
    dist.reset_dist_util()
