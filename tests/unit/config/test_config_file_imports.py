"""Loading a Python config file: its text is read as UTF-8 whatever the locale, and a
relative import that cannot name another config file fails with the fix in the message.
Plus two properties of the nodes an override writes (a struct config takes ``+new`` keys;
a new mapping holds objects, as LazyCall configs need)."""

from __future__ import annotations

import pytest
from locales import ascii_locale
from omegaconf import OmegaConf

from libai.config import LazyConfig
from libai.config.overrides import apply_overrides

HINT = (
    "Within a config file, a relative import can only import another config file, "
    "e.g. `from .common.train import train`."
)


def test_a_config_file_is_read_as_utf8_under_an_ascii_locale(tmp_path):
    path = tmp_path / "c.py"
    path.write_bytes("train = dict(name='caf\u00e9')  # \u00e9t\u00e9\n".encode())
    with ascii_locale():
        cfg = LazyConfig.load(str(path))
    assert cfg.train.name == "caf\u00e9"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("from . import x", "`from . import ...` in {importer} is not supported. " + HINT),
        ("from .sub import x", "cannot import the directory {base}/sub from {importer}. " + HINT),
        (
            "from .missing import x",
            "cannot import .missing from {importer}: {base}/missing.py does not exist.",
        ),
    ],
)
def test_a_relative_import_that_names_no_config_file(tmp_path, line, message):
    (tmp_path / "sub").mkdir()
    importer = tmp_path / "c.py"
    importer.write_text(line + "\n")
    with pytest.raises(ImportError) as info:
        LazyConfig.load(str(importer))
    assert str(info.value) == message.format(importer=importer, base=tmp_path)


def test_a_struct_config_takes_a_new_key():
    cfg = OmegaConf.create({"model": {"a": 1}})
    OmegaConf.set_struct(cfg, True)
    apply_overrides(cfg, ["+model.b=2", "++model.c=3"])
    assert OmegaConf.to_container(cfg) == {"model": {"a": 1, "b": 2, "c": 3}}


def test_a_new_mapping_holds_objects():
    class Obj:
        pass

    cfg = OmegaConf.create({"model": {"a": 1}})
    apply_overrides(cfg, ["+model.extra={b: 1}"])
    obj = Obj()
    cfg.model.extra.o = obj  # a plain config refuses objects unless the node allows them
    assert cfg.model.extra.o is obj and cfg.model.extra.b == 1
