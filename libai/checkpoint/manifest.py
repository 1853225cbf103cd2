"""Checksums of a checkpoint's files: written with the checkpoint, verified before it loads.

``manifest.json`` in a checkpoint directory lists every other file with its size and its
xxh3-64 checksum (``xxhash``, streamed in 8 MiB blocks; hashing runs at memory speed, so the
cost is one read of the files). It is written inside the ``.tmp`` directory before the
atomic rename that commits a checkpoint, so a committed checkpoint always has one.
:class:`~libai.checkpoint.checkpointer.Checkpointer` splits the hashing of a save and the checks of
a load over the ranks (each rank hashes every ``world_size``-th file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

import xxhash

__all__ = [
    "MANIFEST",
    "ManifestError",
    "file_checksum",
    "file_checksums",
    "manifest_text",
    "read_manifest",
    "verify_files",
    "verify_sizes",
]

MANIFEST = "manifest.json"
FORMAT = "libai-manifest-1"
ALGORITHM = "xxh3_64"
_BLOCK = 8 << 20


class ManifestError(ValueError):
    """A file that is missing, has another size or another checksum than its manifest says,
    or a manifest that cannot be read."""


def file_checksum(path: str) -> str:
    """The xxh3-64 checksum of ``path`` (hex), read in blocks."""
    digest = xxhash.xxh3_64()
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def file_checksums(directory: str, names: Iterable[str]) -> dict[str, dict]:
    """``{name: {"size", "xxh3_64"}}`` for the files ``names`` of ``directory``."""
    entries = {}
    for name in names:
        path = os.path.join(directory, name)
        entries[name] = {"size": os.path.getsize(path), ALGORITHM: file_checksum(path)}
    return entries


def manifest_text(entries: Mapping[str, dict]) -> str:
    """The manifest holding ``entries`` (see :func:`file_checksums`)."""
    body = {"format": FORMAT, "algorithm": ALGORITHM, "files": dict(sorted(entries.items()))}
    return json.dumps(body, indent=1) + "\n"


def read_manifest(directory: str) -> dict[str, dict] | None:
    """The ``files`` of ``directory``'s manifest; None when it has none (a checkpoint written
    before manifests existed)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
        files = body["files"]
        if body.get("format") != FORMAT or body.get("algorithm") != ALGORITHM:
            raise ValueError(f"format {body.get('format')!r} / {body.get('algorithm')!r}")
        for entry in files.values():
            int(entry["size"]), str(entry[ALGORITHM])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{path} is unreadable or damaged ({exc})") from None
    return files


def verify_sizes(directory: str, files: Mapping[str, dict]) -> None:
    """Every file of the manifest exists with its size (cheap: no reads)."""
    for name, entry in sorted(files.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ManifestError(f"{name} is missing")
        size = os.path.getsize(path)
        if size != int(entry["size"]):
            raise ManifestError(f"{name} has {size} bytes, its manifest says {entry['size']}")


def verify_files(directory: str, files: Mapping[str, dict], names: Iterable[str]) -> None:
    """The files ``names`` (of the manifest ``files``) have the checksums it records."""
    for name in names:
        want = str(files[name][ALGORITHM])
        got = file_checksum(os.path.join(directory, name))
        if got != want:
            raise ManifestError(
                f"{name} does not match its checksum (xxh3-64 {got}, the manifest says {want})"
            )
