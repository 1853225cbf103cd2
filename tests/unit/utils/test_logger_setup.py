"""libai.utils.logger.setup_logger: where each rank's lines go, at which levels, in which
format, and what a second call replaces."""

from __future__ import annotations

import logging
import re

import pytest

from libai.utils.logger import _log_file, setup_logger

LINE = re.compile(r"^\[\d\d/\d\d \d\d:\d\d:\d\d\] (\S+) (\w+): (.*)$")


@pytest.fixture
def name():
    name = "libai_logger_setup_test"
    yield name
    logger = logging.getLogger(name)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


@pytest.mark.parametrize(
    "output, rank, expected",
    [
        ("out", 0, "out/log.txt"),
        ("out", 3, "out/log.txt.rank3"),
        ("out/run.txt", 0, "out/run.txt"),
        ("out/run.log", 1, "out/run.log.rank1"),
        ("out/txt", 0, "out/txt/log.txt"),
        ("out/run.json", 2, "out/run.json/log.txt.rank2"),
    ],
)
def test_log_file_names(output, rank, expected):
    assert _log_file(output, rank) == expected


def test_format_levels_and_propagation(tmp_path, name, capsys):
    logger = setup_logger(str(tmp_path / "a" / "b"), distributed_rank=0, name=name)
    assert logger is logging.getLogger(name)
    assert logger.level == logging.DEBUG and logger.propagate is False
    logger.info("one")
    logger.debug("two")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and LINE.match(out[0]).groups() == (name, "INFO", "one")
    lines = (tmp_path / "a" / "b" / "log.txt").read_text().splitlines()
    assert [LINE.match(line).groups() for line in lines] == [
        (name, "INFO", "one"),
        (name, "DEBUG", "two"),
    ]


def test_second_call_replaces_only_its_own_handlers_and_appends(tmp_path, name, capsys):
    mine = logging.Handler()
    records = []
    mine.emit = records.append
    logging.getLogger(name).addHandler(mine)
    setup_logger(str(tmp_path / "run.log"), 0, name=name).info("first")
    logger = setup_logger(str(tmp_path / "run.log"), 0, name=name)
    logger.info("second")
    assert [r.getMessage() for r in records] == ["first", "second"]  # the user's handler
    assert len(logger.handlers) == 3
    text = (tmp_path / "run.log").read_text()
    assert "first" in text and "second" in text  # appended, not truncated
    assert capsys.readouterr().out.count("second") == 1


def test_other_ranks_console_warns_only_and_console_only_without_output(tmp_path, name, capsys):
    logger = setup_logger(None, distributed_rank=2, name=name)
    assert len(logger.handlers) == 1
    logger.info("quiet")
    logger.warning("loud")
    out = capsys.readouterr().out
    assert "quiet" not in out and LINE.match(out.strip()).groups() == (name, "WARNING", "loud")
    logger = setup_logger(str(tmp_path), distributed_rank=1, name=name)
    logger.debug("detail")
    assert "detail" in (tmp_path / "log.txt.rank1").read_text()
    assert not (tmp_path / "log.txt").exists()


def test_defaults_configure_the_libai_logger_of_rank_zero(tmp_path, capsys):
    libai = logging.getLogger("libai")
    saved = (list(libai.handlers), libai.level, libai.propagate)
    try:
        logger = setup_logger(str(tmp_path))
        assert logger is libai
        logging.getLogger("libai.some.module").info("default setup")
        out = capsys.readouterr().out.splitlines()
        assert [LINE.match(line).groups() for line in out] == [
            ("libai.some.module", "INFO", "default setup")
        ]
        assert "default setup" in (tmp_path / "log.txt").read_text()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]  # rank 0's file
    finally:
        for handler in list(libai.handlers):
            if handler not in saved[0]:
                libai.removeHandler(handler)
                handler.close()
        libai.handlers[:] = saved[0]
        libai.setLevel(saved[1])
        libai.propagate = saved[2]
