"""PaddleFleetX's own GPT sample building, run from its file kept as a test fixture
(tests/fixtures/fleetx/ppfleetx/data/dataset/gpt_dataset.py, byte for byte).

The file imports paddle at its top; its index functions and the sample methods of its
``GPTDataset`` are plain numpy. They are compiled here from the file's own source (the
paddle imports are skipped) and driven the way FleetX's ``GPTDataset.__init__`` and
``construct_samples_and_shuffle_data`` drive them, minus the cache files and the C++
``build_sample_idx`` (the file keeps its numpy original, ``_build_sample_idx``)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

FLEETX = Path(__file__).resolve().parents[1] / "fixtures" / "fleetx"
GPT_DATASET = FLEETX / "ppfleetx" / "data" / "dataset" / "gpt_dataset.py"
FUNCTIONS = (
    "get_train_valid_test_split_",
    "_num_tokens",
    "_num_epochs",
    "_build_doc_idx",
    "_build_sample_idx",
    "_build_shuffle_idx",
)
METHODS = ("_construct_sample", "_get_single_sample_from_idx", "__getitem__", "__len__")
#: FleetX's language modules (GPT generation's length rule, ...)
LANGUAGE_MODULE = FLEETX / "ppfleetx" / "models" / "language_model" / "language_module.py"


def fleetx_function(path: Path, class_name: str | None, name: str):
    """A function (or a method, as a plain function taking ``self`` first) of FleetX's file
    ``path``, compiled from the fixture's own source; its paddle imports are not run, so only
    plain-Python functions (numpy, re, math) work."""
    import math
    import re

    nodes = ast.parse(path.read_text()).body
    if class_name is not None:
        nodes = next(n for n in nodes if isinstance(n, ast.ClassDef) and n.name == class_name).body
    node = next(n for n in nodes if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"np": np, "re": re, "math": math}
    module = ast.fix_missing_locations(ast.Module([node], []))
    exec(compile(module, str(path), "exec"), namespace)
    return namespace[name]


def _fleetx_namespace() -> dict:
    tree = ast.parse(GPT_DATASET.read_text())
    namespace: dict = {"np": np}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS:
            exec(compile(ast.Module([node], []), str(GPT_DATASET), "exec"), namespace)
        if isinstance(node, ast.ClassDef) and node.name == "GPTDataset":
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            body = [m for m in methods if m.name in METHODS]
            cls = ast.ClassDef("FleetXSamples", [], [], body, [])
            module = ast.fix_missing_locations(ast.Module([cls], []))
            exec(compile(module, str(GPT_DATASET), "exec"), namespace)
    return namespace


def fleetx_samples(prefix: str, split, max_seq_len: int, num_samples: int, mode: str, seed: int):
    """FleetX's ``GPTDataset`` samples for the corpus at ``prefix`` (its ``_ids.npy`` /
    ``_idx.npz``), an object with FleetX's ``__getitem__`` and ``__len__``."""
    ns = _fleetx_namespace()
    sample_ids = np.load(prefix + "_ids.npy", mmap_mode="r", allow_pickle=True)
    sample_lens = np.load(prefix + "_idx.npz")["lens"]
    splits = ns["get_train_valid_test_split_"](split, len(sample_lens))
    index = {"Train": 0, "Eval": 1, "Test": 2}[mode]
    documents = np.arange(splits[index], splits[index + 1])
    # construct_samples_and_shuffle_data, step by step
    tokens_per_epoch = ns["_num_tokens"](documents, sample_lens)
    num_epochs = ns["_num_epochs"](tokens_per_epoch, max_seq_len, num_samples)
    np_rng = np.random.RandomState(seed=seed)
    separate_last_epoch = False
    if num_epochs > 1:
        from_minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // max_seq_len
        last = num_samples - from_minus_one
        per_epoch = (tokens_per_epoch - 1) // max_seq_len
        separate_last_epoch = last < int(0.80 * per_epoch)
    doc_idx = ns["_build_doc_idx"](documents, num_epochs, np_rng, separate_last_epoch)
    sample_idx = ns["_build_sample_idx"](
        sample_lens, doc_idx, max_seq_len, num_epochs, tokens_per_epoch
    )
    first = from_minus_one if separate_last_epoch else sample_idx.shape[0] - 1
    shuffle_idx = ns["_build_shuffle_idx"](first, sample_idx.shape[0] - 1, np_rng)

    samples = ns["FleetXSamples"]()
    samples.mode, samples.eos_id = mode, 0
    samples.sample_ids, samples.sample_lens = sample_ids, sample_lens
    samples.doc_idx, samples.sample_idx, samples.shuffle_idx = doc_idx, sample_idx, shuffle_idx
    samples.start_pos = [0] + np.cumsum(sample_lens).tolist()
    samples.num_epochs = num_epochs
    return samples


def write_fleetx_corpus(prefix: str, documents: list[list[int]], dtype=np.uint16) -> None:
    """``documents`` (one item each) in FleetX's format, as its preprocess_data.py writes
    them: the ids concatenated in ``_ids.npy``; ``lens`` (int32) and ``docs`` (int64
    cumulative item counts, from 0) in ``_idx.npz``."""
    ids = np.concatenate([np.asarray(d, dtype=dtype) for d in documents])
    lens = np.asarray([len(d) for d in documents], dtype=np.int32)
    docs = np.arange(len(documents) + 1, dtype=np.int64)
    np.save(prefix + "_ids.npy", ids)
    np.savez(prefix + "_idx.npz", lens=lens, docs=docs)
