"""LiBai's ``libai.utils.file_utils`` without the network: local paths and libai's cache only.

LiBai's projects call ``get_data_from_cache(url, cache_dir, md5=...)`` (QQP, PaLM: a file
named after the URL's last part in ``cache_dir``) and ``download_file(out_path, url)`` (CLIP,
DALLE2), and LiBai's helpers ``cached_path`` / ``get_from_cache`` (a file named by the URL's
hash in the cache). Here nothing is downloaded at run time: each function returns the file
when it is already where LiBai would have put it (checked against ``md5`` when given), and
otherwise raises :class:`OfflineError`, one line naming the URL and the exact path to put
the file at.

The cache directory is ``$LIBAI_CACHE_DIR``, else ``$OF_CACHE_ROOT/libai`` (LiBai's
variable), else ``$XDG_CACHE_HOME/libai`` (``~/.cache/libai``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from urllib.parse import urlparse

from libai.utils.errors import OneLineError

logger = logging.getLogger(__name__)

__all__ = [
    "OfflineError",
    "cached_path",
    "default_cache_path",
    "download_file",
    "filename_to_url",
    "get_data_from_cache",
    "get_from_cache",
    "get_md5",
    "url_to_filename",
]

_REMOTE = ("http", "https", "s3", "ftp")


class OfflineError(FileNotFoundError, OneLineError):
    """A remote file that is not where it would have been downloaded to."""


def default_cache_path() -> str:
    """libai's cache directory (see the module docstring)."""
    if os.environ.get("LIBAI_CACHE_DIR"):
        return os.environ["LIBAI_CACHE_DIR"]
    if os.environ.get("OF_CACHE_ROOT"):
        return os.path.join(os.environ["OF_CACHE_ROOT"], "libai")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "libai")


def _offline(url: str, path: str, why: str = "is not there") -> OfflineError:
    return OfflineError(
        f"{path} {why}, and nothing is downloaded at run time: fetch {url} yourself and save "
        f"it as {path} (or pass a local path)."
    )


def url_to_filename(url: str, etag: str | None = None) -> str:
    """The cache file name of ``url``: sha256 of the URL (``.`` sha256 of ``etag``)."""
    name = hashlib.sha256(url.encode("utf-8")).hexdigest()
    if etag:
        name += "." + hashlib.sha256(etag.encode("utf-8")).hexdigest()
    return name + (".h5" if url.endswith(".h5") else "")


def filename_to_url(filename: str, cache_dir=None) -> tuple[str, str | None]:
    """``(url, etag)`` recorded next to a cached file (its ``.json``)."""
    path = os.path.join(os.fspath(cache_dir or default_cache_path()), filename)
    for needed in (path, path + ".json"):
        if not os.path.exists(needed):
            raise FileNotFoundError(f"file {needed} not found")
    with open(path + ".json", encoding="utf-8") as f:
        meta = json.load(f)
    return meta["url"], meta.get("etag")


def get_from_cache(url: str, cache_dir=None, force_download: bool = False, **_ignored) -> str:
    """The cached file of ``url`` (named :func:`url_to_filename`, with or without an etag
    suffix); :class:`OfflineError` when it is not cached or ``force_download`` is asked."""
    cache_dir = os.fspath(cache_dir or default_cache_path())
    path = os.path.join(cache_dir, url_to_filename(url))
    if force_download:
        raise _offline(url, path, "cannot be re-downloaded (force_download=True)")
    if os.path.exists(path):
        return path
    if os.path.isdir(cache_dir):
        variants = fnmatch.filter(os.listdir(cache_dir), url_to_filename(url) + ".*")
        variants = sorted(v for v in variants if not v.endswith(".json"))
        if variants:
            return os.path.join(cache_dir, variants[-1])
    raise _offline(url, path)


def cached_path(url_or_filename, cache_dir=None, force_download: bool = False, **_ignored) -> str:
    """A local path as it is (it must exist), or a URL's cached file (:func:`get_from_cache`)."""
    name = os.fspath(url_or_filename)  # a str, or any os.PathLike (not only pathlib's)
    scheme = urlparse(name).scheme
    if scheme in _REMOTE:
        return get_from_cache(name, cache_dir=cache_dir, force_download=force_download)
    if os.path.exists(name):
        return name
    if scheme == "" or os.path.isabs(name):
        raise FileNotFoundError(f"file {name} not found")
    raise ValueError(f"unable to parse {name} as a URL or as a local path")


def get_md5(fname) -> str:
    """The md5 hex digest of a file's bytes."""
    digest = hashlib.md5()
    with open(fname, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(out_path, url: str) -> str:
    """LiBai downloads ``url`` to ``out_path``; here ``out_path`` must already hold it."""
    out_path = os.fspath(out_path)
    if not os.path.isfile(out_path):
        raise _offline(url, out_path)
    logger.info("%s: using the local file for %s (no download)", out_path, url)
    return out_path


def get_data_from_cache(url: str, cache_dir=None, force_download: bool = False, md5=None) -> str:
    """The file ``cache_dir/<last part of url>`` (LiBai's layout), checked against ``md5``
    when given; :class:`OfflineError` when it is missing, differs from ``md5``, or
    ``force_download`` is asked."""
    cache_dir = os.fspath(cache_dir or default_cache_path())
    path = os.path.join(cache_dir, url.split("/")[-1])
    if force_download:
        raise _offline(url, path, "cannot be re-downloaded (force_download=True)")
    if not os.path.isfile(path):
        raise _offline(url, path)
    if md5 is not None:
        actual = get_md5(path)
        if actual != md5:
            raise _offline(url, path, f"has md5 {actual}, not the expected {md5}")
    return path
