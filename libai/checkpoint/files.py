"""The files of a checkpoint directory: validation before loading, atomic writes, run identity
and one-line descriptions of what went wrong.

Everything here runs on one rank and reads or writes files only; the collectives live in
:mod:`libai.checkpoint.checkpointer`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

from libai.checkpoint.manifest import (
    MANIFEST,
    ManifestError,
    read_manifest,
    verify_files,
    verify_sizes,
)
from libai.checkpoint.safe_load import (
    CorruptDataError,
    UnsafeDataError,
    read_dcp_metadata,
    torch_load_data,
)
from libai.utils.errors import OneLineError

FORMAT = "libai-dcp-1"
META = "meta.json"
METADATA = ".metadata"
TMP_SUFFIX = ".tmp"
OLD_SUFFIX = ".old"


class CheckpointError(RuntimeError, OneLineError):
    """A checkpoint that is missing, incomplete, corrupt, unsafe or does not fit the model;
    or a save that failed. The message is one line and names the checkpoint."""


def rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


# ---- describing failures ----------------------------------------------------------------------
def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the per-rank failures of a DCP exception."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        if isinstance(e, CheckpointException):
            for failure in e.failures.values():
                todo.append(failure[0] if isinstance(failure, tuple) else failure)


def one_line(exc: BaseException) -> str:
    """``Type: message`` of the innermost failure of ``exc``, first line only (DCP's own
    exception text holds every rank's traceback)."""
    if isinstance(exc, CheckpointException):
        inner = [e for e in exception_chain(exc) if not isinstance(e, CheckpointException)]
        exc = inner[0] if inner else exc
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_disk_full(exc: BaseException, directory: str) -> bool:
    """Whether a failed write into ``directory`` ran out of space: an ENOSPC / EDQUOT in the
    chain, or (torch's zip writer reports a short write without errno) less than 1 MiB free
    on the file system."""
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
    try:
        return shutil.disk_usage(directory).free < (1 << 20)
    except OSError:
        return False


def fallback_hint(path: str) -> str:
    """``"; the newest other checkpoint in DIR is X"`` (by its metadata's time), for errors
    about a bad checkpoint."""
    parent = os.path.dirname(os.path.abspath(path))
    me = os.path.basename(os.path.abspath(path))
    candidates = []
    for entry in list_checkpoints(parent):
        if entry != me and not entry.endswith(OLD_SUFFIX):
            candidates.append((os.path.getmtime(os.path.join(parent, entry, METADATA)), entry))
    if not candidates:
        return f"; there is no other checkpoint in {parent} to fall back to"
    return f"; fall back to {os.path.join(parent, max(candidates)[1])}, the newest other one"


# ---- the directory ----------------------------------------------------------------------------
#: the file in an output directory naming its newest checkpoint
LAST_CHECKPOINT = "last_checkpoint"


def read_last_checkpoint(save_dir: str) -> str | None:
    """The checkpoint directory ``save_dir/last_checkpoint`` names, or None (no such file, or
    an empty or unreadable one)."""
    try:
        with open(os.path.join(save_dir, LAST_CHECKPOINT)) as f:
            name = f.read().strip()
    except OSError:
        return None
    return os.path.join(save_dir, name) if name else None


def list_checkpoints(save_dir: str) -> list[str]:
    """Names of the complete checkpoint directories in ``save_dir`` (sorted)."""
    if not os.path.isdir(save_dir):
        return []
    return sorted(
        d
        for d in os.listdir(save_dir)
        if not d.endswith((TMP_SUFFIX, OLD_SUFFIX))
        and os.path.isfile(os.path.join(save_dir, d, METADATA))
    )


def run_id_of(checkpoint: str) -> str | None:
    """The id of the run that saved ``checkpoint`` (its ``meta.json``), None if unknown."""
    try:
        with open(os.path.join(checkpoint, META), encoding="utf-8") as f:
            value = json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def aside_path(checkpoint: str) -> str:
    """A free name next to ``checkpoint`` that keeps another run's checkpoint of the same
    name: ``model_0000099.run-<its run id>`` (``.earlier-run`` if it has none)."""
    run_id = run_id_of(checkpoint)
    base = f"{checkpoint}.run-{run_id}" if run_id else f"{checkpoint}.earlier-run"
    candidate, n = base, 2
    while os.path.exists(candidate):
        candidate, n = f"{base}-{n}", n + 1
    return candidate


def is_our_leftover(path: str) -> bool:
    """A ``.tmp`` / ``.old`` directory that only holds checkpoint files."""
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    pattern = re.compile(
        r"^(__\d+_\d+\.distcp.*|\.metadata.*|rank_\d+\.pt.*|meta\.json.*|manifest\.json.*)$"
    )
    return all(pattern.match(e) for e in entries)


def write_text_atomic(path: str, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename (never half-written)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_bytes_durable(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---- validation before loading ------------------------------------------------------------------
def read_rank_file(path: str, rank: int) -> dict:
    """``rank_<rank>.pt`` of checkpoint ``path``, read as data (weights-only)."""
    file = os.path.join(path, rank_file(rank))
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint {path} is incomplete: {file} is missing.")
    try:
        state = torch_load_data(file)
    except UnsafeDataError as exc:
        raise CheckpointError(
            f"refusing to load checkpoint {path}: {rank_file(rank)} {exc}."
        ) from None
    except (CorruptDataError, OSError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: {rank_file(rank)} {exc}{fallback_hint(path)}."
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: {file} is not a libai checkpoint file.")
    return state


def verify_manifest(path: str, rank: int, world_size: int) -> bool:
    """Check ``path``'s files against its manifest: every size, and the checksums of this
    rank's share (every ``world_size``-th file). False when there is no manifest."""
    try:
        files = read_manifest(path)
        if files is None:
            return False
        verify_sizes(path, files)
        verify_files(path, files, sorted(files)[rank::world_size])
    except ManifestError as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: {exc}{fallback_hint(path)}."
        ) from None
    return True


def check_checkpoint(path: str, rank: int = 0, world_size: int = 1) -> tuple[dict, bool]:
    """Fail with a clear :class:`CheckpointError` naming ``path`` unless the checkpoint is
    complete, matches its manifest and is safe to read; returns rank 0's state file and
    whether a manifest was verified.

    Runs no collective: every rank checks sizes and metadata, and the checksums of its
    share of the files, so a bad checkpoint fails before any rank can wait in DCP.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory).")
    meta_path = os.path.join(path, METADATA)
    if not os.path.isfile(meta_path):
        raise CheckpointError(
            f"checkpoint {path} is incomplete or corrupt: {meta_path} is missing."
        )
    verified = verify_manifest(path, rank, world_size)
    try:
        metadata = read_dcp_metadata(path)
    except UnsafeDataError as exc:
        raise CheckpointError(f"refusing to load checkpoint {path}: {METADATA} {exc}.") from None
    except (CorruptDataError, OSError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: {METADATA} {exc}{fallback_hint(path)}."
        ) from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for rel, end in sorted(needed.items()):
        file = os.path.join(path, rel)
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} is incomplete: shard file {file} is missing.")
        size = os.path.getsize(file)
        if size < end:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: shard file {file} is truncated "
                f"({size} bytes, the metadata needs {end}){fallback_hint(path)}."
            )
    rank0 = read_rank_file(path, 0)
    for r in range(int(rank0["layout"]["world_size"])):
        file = os.path.join(path, rank_file(r))
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} is incomplete: {file} is missing.")
    return rank0, verified


__all__ = [
    "LAST_CHECKPOINT",
    "MANIFEST",
    "CheckpointError",
    "aside_path",
    "check_checkpoint",
    "exception_chain",
    "fallback_hint",
    "is_disk_full",
    "list_checkpoints",
    "one_line",
    "read_last_checkpoint",
    "read_rank_file",
    "run_id_of",
]
