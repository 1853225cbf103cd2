"""Data and models the way ``datasets`` / ``transformers`` users name them.

``--data-path X [--data-name Y]`` is ``datasets.load_dataset(X, Y)``: a Hub id (online, or from
the Hugging Face cache when offline), a local dataset repository (a directory laid out as on
the Hub, e.g. GLUE's ``glue/README.md`` with its ``configs:`` header and
``glue/mrpc/{train,validation,test}-*.parquet``), a ``datasets.save_to_disk`` directory, or a
data file (CSV / TSV / JSON lines / parquet / arrow). The splits come from the dataset:
``train`` trains, the first ``validation*`` split evaluates.

``--pretrained-model-name-or-path`` is a local model directory or a Hub id, resolved to the
directory of its snapshot in the Hugging Face cache (downloaded only when the hub is online).

GLUE / SuperGLUE text columns are inferred from the dataset's columns when
``--text-columns`` is not given (:func:`infer_text_columns`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

logger = logging.getLogger(__name__)

__all__ = [
    "TEXT_COLUMN_CHOICES",
    "evaluation_split",
    "infer_text_columns",
    "load_data",
    "offline_by_default",
    "resolve_model_dir",
    "train_and_eval_splits",
]

#: text columns of the GLUE / SuperGLUE tasks (and common single-text sets), most specific
#: first: the first entry whose columns all exist is taken
TEXT_COLUMN_CHOICES = (
    ("sentence1", "sentence2"),  # MRPC, RTE, WNLI, STS-B; SuperGLUE WiC
    ("question1", "question2"),  # QQP
    ("premise", "hypothesis"),  # MNLI, CB, AX
    ("question", "sentence"),  # QNLI
    ("question", "passage"),  # BoolQ
    ("sentence",),  # CoLA, SST-2
    ("text",),
)

#: file extension -> the ``datasets`` builder that reads it
FILE_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
}


def offline_by_default() -> None:
    """Nothing is downloaded unless the user says so (``HF_HUB_OFFLINE=0``): Hub ids are read
    from the Hugging Face cache. Set before ``datasets`` reads its configuration."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", os.environ["HF_HUB_OFFLINE"])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def _datasets_offline(offline: bool):
    """``datasets`` in offline mode while loading (it reads ``HF_HUB_OFFLINE`` once, when it
    is first imported: a later setting would be ignored and the hub retried for seconds)."""
    import datasets

    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = before or offline
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def _is_saved_to_disk(path: str) -> bool:
    names = set(os.listdir(path))
    return "dataset_dict.json" in names or {"state.json", "dataset_info.json"} <= names


def load_data(path: str, name: str | None = None, flag: str = "--data-path") -> dict:
    """The splits of ``datasets.load_dataset(path, name)`` as ``{split: Dataset}`` (a single
    file or a saved ``Dataset`` is the ``train`` split). Local data is read into memory
    through a private cache (ranks never share one); a Hub id uses the Hugging Face cache."""
    import datasets

    looks_local = path.startswith((".", os.sep)) or os.path.splitext(path)[1] in FILE_FORMATS
    if looks_local and not os.path.exists(path):
        raise FileNotFoundError(f"{flag} {path!r}: no such file or directory")
    if os.path.isfile(path):
        ext = os.path.splitext(path)[1].lower()
        if ext not in FILE_FORMATS:
            raise ValueError(
                f"{flag} {path}: unsupported file type {ext!r}; use "
                f"{', '.join(sorted(FILE_FORMATS))}, a dataset directory or a Hub dataset id"
            )
        if name is not None:
            raise ValueError(f"{flag} {path} is a file: --data-name {name} applies to datasets")
        kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
        with tempfile.TemporaryDirectory() as cache:
            loaded = datasets.load_dataset(
                FILE_FORMATS[ext],
                data_files=path,
                split="train",
                cache_dir=cache,
                keep_in_memory=True,
                **kwargs,
            )
        return {"train": loaded}
    if os.path.isdir(path) and _is_saved_to_disk(path):
        loaded = datasets.load_from_disk(path)
        if isinstance(loaded, datasets.Dataset):
            return {"train": loaded}
        return dict(loaded)
    args = [path] if name is None else [path, name]
    try:
        if os.path.isdir(path):  # a local dataset repository
            with tempfile.TemporaryDirectory() as cache:
                loaded = datasets.load_dataset(*args, cache_dir=cache, keep_in_memory=True)
        else:  # a Hub id: the Hugging Face cache (offline) or the hub
            with _datasets_offline(_offline()):
                loaded = datasets.load_dataset(*args)
    except (FileNotFoundError, ConnectionError, ValueError) as e:
        where = "a local directory" if os.path.isdir(path) else "a Hub dataset id"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"{flag} {path}{' --data-name ' + name if name else ''}: datasets.load_dataset "
            f"could not load it as {where} ({first}). Give a data file, a save_to_disk or "
            "dataset repository directory, or a Hub id in the Hugging Face cache"
        ) from e
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def evaluation_split(splits: dict) -> str | None:
    """The split that evaluates: ``validation``, else the first ``validation*`` one
    (MNLI's ``validation_matched``), else ``None``."""
    if "validation" in splits:
        return "validation"
    return next((s for s in splits if s.startswith("validation")), None)


def train_and_eval_splits(data_path: str, data_name: str | None, validation_path=None):
    """``(train, valid)``: the ``train`` split of ``--data-path`` [``--data-name``] and its
    evaluation split (:func:`evaluation_split`; ``None`` without one), or the data of
    ``--validation-path`` when given."""
    splits = load_data(data_path, data_name, "--data-path")
    if "train" not in splits:
        raise ValueError(f"--data-path {data_path}: no 'train' split (found {list(splits)})")
    if validation_path:
        other = load_data(validation_path, None, "--validation-path")
        valid = other[evaluation_split(other) or "train"]
    else:
        name = evaluation_split(splits)
        valid = splits[name] if name else None
    logger.info(
        "data %s%s: %d training rows, %s",
        data_path,
        f" ({data_name})" if data_name else "",
        len(splits["train"]),
        f"{len(valid)} evaluation rows" if valid is not None else "no evaluation split",
    )
    return splits["train"], valid


def infer_text_columns(columns) -> list[str]:
    """The text columns of a GLUE / SuperGLUE-style dataset (see ``TEXT_COLUMN_CHOICES``)."""
    found = set(columns)
    for choice in TEXT_COLUMN_CHOICES:
        if set(choice) <= found:
            return list(choice)
    raise ValueError(
        f"cannot tell the text columns among {list(columns)}; give --text-columns A[,B]"
    )


def resolve_model_dir(name_or_path: str, flag: str = "--pretrained-model-name-or-path") -> str:
    """A local model directory: ``name_or_path`` itself, or the snapshot of a Hub id in the
    Hugging Face cache (fetched when the hub is online)."""
    if os.path.isdir(name_or_path):
        return name_or_path
    if os.path.exists(name_or_path):
        raise ValueError(f"{flag} {name_or_path} is a file, not a model directory")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name_or_path, local_files_only=_offline())
    except Exception as e:  # huggingface_hub's errors have no common base worth naming
        raise FileNotFoundError(
            f"{flag} {name_or_path!r} is neither a local model directory nor a Hub model in the "
            f"Hugging Face cache ({type(e).__name__}); pass a directory saved by "
            "save_pretrained, or download the model first"
        ) from e
