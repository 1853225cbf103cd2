"""libai.utils.file_utils, LiBai's helpers its projects call (QQP / PaLM:
get_data_from_cache; CLIP / DALLE2: download_file; cached_path / get_from_cache), with the
network closed: files where LiBai would have downloaded them are found (md5 checked against
hashlib's), anything else is one clear error naming the URL and the path, and no socket is
ever opened."""

from __future__ import annotations

import hashlib
import socket

import pytest

from libai.utils import file_utils as fu

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
    with pytest.raises(FileNotFoundError, match="not found"):
        fu.cached_path(tmp_path / "missing.txt")
    out = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    with pytest.raises(fu.OfflineError, match=str(out)):
        fu.download_file(str(out), URL)
    out.write_bytes(b"bpe")
    assert fu.download_file(str(out), URL) == str(out)
