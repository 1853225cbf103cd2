"""libai.utils.file_utils, LiBai's helpers its projects call (QQP / PaLM:
get_data_from_cache; CLIP / DALLE2: download_file; cached_path / get_from_cache), with the
network closed: files where LiBai would have downloaded them are found (md5 checked against
hashlib's), anything else is one clear error naming the URL and the path, and no socket is
ever opened."""

from __future__ import annotations

import hashlib
import os
import socket

import locales
import pytest

from libai.utils import file_utils as fu
from libai.utils.errors import OneLineError

URL = "https://oneflow-static.oss-cn-beijing.aliyuncs.com/ci-files/dataset/libai/QQP/train.tsv"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("file_utils opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_get_data_from_cache_finds_checks_and_refuses(tmp_path):
    with pytest.raises(fu.OfflineError, match=f"fetch {URL} yourself and save it as "):
        fu.get_data_from_cache(URL, tmp_path)
    path = tmp_path / "train.tsv"
    path.write_bytes(b"id\tq1\tq2\n")
    md5 = hashlib.md5(b"id\tq1\tq2\n").hexdigest()
    assert fu.get_md5(path) == md5
    assert fu.get_data_from_cache(URL, tmp_path, md5=md5) == str(path)
    with pytest.raises(fu.OfflineError, match=f"has md5 {md5}, not the expected 0+"):
        fu.get_data_from_cache(URL, tmp_path, md5="0" * 32)
    with pytest.raises(fu.OfflineError, match="force_download"):
        fu.get_data_from_cache(URL, tmp_path, force_download=True)


class _PathLike(os.PathLike):
    """An ``os.PathLike`` that is not a ``pathlib.Path`` (as ``os.DirEntry`` is)."""

    def __init__(self, path: str):
        self.path = path

    def __fspath__(self) -> str:
        return self.path


def test_cache_by_url_hash_local_paths_and_download_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path / "cache"))
    assert fu.default_cache_path() == str(tmp_path / "cache")
    name = hashlib.sha256(URL.encode()).hexdigest()
    assert fu.url_to_filename(URL) == name
    with pytest.raises(fu.OfflineError, match=name):
        fu.cached_path(URL)
    (tmp_path / "cache").mkdir()
    cached = tmp_path / "cache" / f"{name}.{hashlib.sha256(b'etag').hexdigest()}"
    cached.write_text("x")
    (tmp_path / "cache" / (cached.name + ".json")).write_text(f'{{"url": "{URL}", "etag": "etag"}}')
    assert fu.cached_path(URL) == str(cached)
    assert fu.filename_to_url(cached.name) == (URL, "etag")
    assert fu.cached_path(cached) == str(cached)  # a local path as it is
    assert fu.cached_path(_PathLike(str(cached))) == str(cached)  # any os.PathLike
    with pytest.raises(FileNotFoundError, match="not found"):
        fu.cached_path(tmp_path / "missing.txt")
    out = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    with pytest.raises(fu.OfflineError, match=str(out)):
        fu.download_file(str(out), URL)
    out.write_bytes(b"bpe")
    assert fu.download_file(str(out), URL) == str(out)


# ---- every rule, each with its own case -------------------------------------------------------------
def test_default_cache_path_order(monkeypatch, tmp_path):
    for name in ("LIBAI_CACHE_DIR", "OF_CACHE_ROOT", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fu.default_cache_path() == str(tmp_path / "home" / ".cache" / "libai")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fu.default_cache_path() == str(tmp_path / "xdg" / "libai")
    monkeypatch.setenv("OF_CACHE_ROOT", str(tmp_path / "of"))
    assert fu.default_cache_path() == str(tmp_path / "of" / "libai")
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path / "mine"))
    assert fu.default_cache_path() == str(tmp_path / "mine")
    # an empty variable counts as unset
    monkeypatch.setenv("LIBAI_CACHE_DIR", "")
    assert fu.default_cache_path() == str(tmp_path / "of" / "libai")
    monkeypatch.setenv("OF_CACHE_ROOT", "")
    assert fu.default_cache_path() == str(tmp_path / "xdg" / "libai")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert fu.default_cache_path() == str(tmp_path / "home" / ".cache" / "libai")


def test_url_to_filename_with_etag_and_h5():
    sha = lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest()  # noqa: E731
    etag = 'W/"abc"'
    assert fu.url_to_filename(URL, etag=etag) == sha(URL) + "." + sha(etag)
    assert fu.url_to_filename(URL, etag="") == sha(URL)  # an empty etag adds nothing
    h5 = "https://host/model/weights.h5"
    assert fu.url_to_filename(h5) == sha(h5) + ".h5"
    assert fu.url_to_filename(h5, etag="e") == f"{sha(h5)}.{sha('e')}.h5"
    assert fu.url_to_filename("https://host/a.h5.txt") == sha("https://host/a.h5.txt")


def test_filename_to_url_needs_the_file_and_its_json(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileNotFoundError, match=f"file {tmp_path / 'f'}.json not found"):
        fu.filename_to_url("f", tmp_path)
    with pytest.raises(FileNotFoundError, match=f"file {tmp_path / 'g'} not found"):
        (tmp_path / "g.json").write_text("{}")
        fu.filename_to_url("g", tmp_path)
    (tmp_path / "f.json").write_text('{"url": "https://a/b"}')
    assert fu.filename_to_url("f", tmp_path) == ("https://a/b", None)
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path))
    assert fu.filename_to_url("f") == ("https://a/b", None)


def test_get_from_cache_exact_name_then_the_newest_etag_variant(tmp_path, monkeypatch):
    name = fu.url_to_filename(URL)
    with pytest.raises(fu.OfflineError, match=str(tmp_path / "none" / name)):
        fu.get_from_cache(URL, cache_dir=tmp_path / "none")  # no cache directory at all
    (tmp_path / f"{name}.json").write_text("{}")  # metadata alone is not the file
    (tmp_path / f"{name}.json.json").write_text("{}")
    with pytest.raises(fu.OfflineError, match=f"save it as {tmp_path / name} "):
        fu.get_from_cache(URL, cache_dir=tmp_path)
    for etag in ("aaa", "ccc", "bbb"):
        (tmp_path / f"{name}.{etag}").write_text(etag)
    assert fu.get_from_cache(URL, cache_dir=tmp_path) == str(tmp_path / f"{name}.ccc")
    (tmp_path / name).write_text("exact")
    assert fu.get_from_cache(URL, cache_dir=tmp_path) == str(tmp_path / name)
    with pytest.raises(fu.OfflineError, match="cannot be re-downloaded"):
        fu.get_from_cache(URL, cache_dir=tmp_path, force_download=True)
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path))
    assert fu.get_from_cache(URL) == str(tmp_path / name)
    assert fu.get_from_cache(URL, cache_dir="", user_agent="x") == str(tmp_path / name)


@pytest.mark.parametrize("scheme", ["http", "https", "s3", "ftp"])
def test_cached_path_sends_remote_schemes_to_the_cache(tmp_path, scheme):
    url = f"{scheme}://bucket/dir/vocab.txt"
    cached = tmp_path / fu.url_to_filename(url)
    cached.write_text("v")
    assert fu.cached_path(url, cache_dir=tmp_path) == str(cached)
    with pytest.raises(fu.OfflineError, match="force_download"):
        fu.cached_path(url, cache_dir=tmp_path, force_download=True)
    # a local file of the same name as the URL is not taken for it
    with pytest.raises(fu.OfflineError):
        fu.cached_path(url, cache_dir=tmp_path / "empty")


def test_cached_path_local_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.txt").write_text("h")
    assert fu.cached_path("here.txt") == "here.txt"
    assert fu.cached_path(str(tmp_path / "here.txt")) == str(tmp_path / "here.txt")
    with pytest.raises(FileNotFoundError, match="file missing.txt not found") as info:
        fu.cached_path("missing.txt")
    assert not isinstance(info.value, fu.OfflineError)
    with pytest.raises(FileNotFoundError, match="not found"):
        fu.cached_path(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="unable to parse gs://b/x as a URL or as a local path"):
        fu.cached_path("gs://b/x")
    (tmp_path / "gs:").mkdir()
    (tmp_path / "gs:" / "y").write_text("y")
    assert fu.cached_path("gs:/y") == "gs:/y"  # a local path with a colon, as it is


def test_get_md5_of_a_file_larger_than_one_chunk(tmp_path):
    data = bytes(range(256)) * 9000  # 2.3 MB: three reads of 1 MiB
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert fu.get_md5(path) == hashlib.md5(data).hexdigest()
    assert fu.get_md5(str(path)) == hashlib.md5(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert fu.get_md5(tmp_path / "empty") == hashlib.md5(b"").hexdigest()


def test_download_file_needs_a_file(tmp_path):
    with pytest.raises(fu.OfflineError, match=f"{tmp_path} is not there"):
        fu.download_file(tmp_path, URL)  # a directory is not the file
    out = tmp_path / "clip.pt"
    out.write_bytes(b"w")
    assert fu.download_file(out, URL) == str(out)


def test_get_data_from_cache_path_and_default_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBAI_CACHE_DIR", str(tmp_path))
    (tmp_path / "train.tsv").mkdir()  # a directory of that name is not the file
    with pytest.raises(fu.OfflineError, match=f"save it as {tmp_path / 'train.tsv'} "):
        fu.get_data_from_cache(URL)
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.tsv").write_bytes(b"x")
    assert fu.get_data_from_cache(URL, other) == str(other / "train.tsv")
    assert fu.get_data_from_cache(URL, str(other), md5=None) == str(other / "train.tsv")
    md5 = hashlib.md5(b"x").hexdigest()
    assert fu.get_data_from_cache(URL, other, md5=md5) == str(other / "train.tsv")
    with pytest.raises(fu.OfflineError, match=f"has md5 {md5}, not the expected abc"):
        fu.get_data_from_cache(URL, other, md5="abc")
    with pytest.raises(fu.OfflineError, match="force_download"):
        fu.get_data_from_cache(URL, other, force_download=True, md5=md5)
    err = fu.OfflineError("x")
    assert isinstance(err, FileNotFoundError) and isinstance(err, OneLineError)


@pytest.fixture
def ascii_locale():
    """The process's locale encoding is ASCII (``LC_CTYPE=C``), as on a bare container."""
    with locales.ascii_locale():
        yield


def test_filename_to_url_reads_its_json_as_utf8_in_any_locale(tmp_path, ascii_locale):
    import json

    url, etag = "https://hf.co/ünï/模型.bin", 'W/"é"'
    (tmp_path / "f").write_text("x")
    (tmp_path / "f.json").write_bytes(
        json.dumps({"url": url, "etag": etag}, ensure_ascii=False).encode("utf-8")
    )
    with open(tmp_path / "f") as f:
        assert f.encoding == "ANSI_X3.4-1968"  # the default encoding cannot read the file
    assert fu.filename_to_url("f", tmp_path) == (url, etag)
