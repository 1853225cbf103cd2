"""``locate`` (dotted import paths, the errors it names) and ``init_signature``, each
against a hand-built module tree or a signature written out."""

from __future__ import annotations

import sys

import pytest

from libai.config.configurable import configurable, init_signature
from libai.config.instantiate import locate


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """``zz_locate_pkg`` with a submodule ``sub`` (not imported yet) and a broken one."""
    pkg = tmp_path / "zz_locate_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text(
        "def foo():\n    return 1\n\n\ndef _fo():\n    return 2\n\n\nfoe = 3\n"
    )
    (pkg / "broken.py").write_text("import zz_no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zz_locate_pkg"
    for name in [m for m in sys.modules if m.startswith("zz_locate_pkg")]:
        del sys.modules[name]


def test_a_submodule_is_imported_on_the_way(tree):
    assert "zz_locate_pkg.sub" not in sys.modules
    assert locate("zz_locate_pkg.sub.foo")() == 1


def test_a_missing_module_inside_a_module_is_not_hidden(tree):
    with pytest.raises(ModuleNotFoundError) as info:
        locate("zz_locate_pkg.broken.f")
    assert info.value.name == "zz_no_such_module_xyz"


def test_a_missing_attribute_names_the_close_public_ones(tree):
    with pytest.raises(ImportError) as info:
        locate("zz_locate_pkg.sub.fo")
    # difflib: 'foe' and 'foo' tie (0.8; ties in reverse order); '_fo' is private
    assert str(info.value) == (
        "cannot locate 'zz_locate_pkg.sub.fo': 'zz_locate_pkg.sub' has no attribute 'fo'; "
        "did you mean zz_locate_pkg.sub.foo, zz_locate_pkg.sub.foe?"
    )
    with pytest.raises(ImportError) as info:
        locate("zz_locate_pkg.sub.qqqqqq")
    assert str(info.value) == (
        "cannot locate 'zz_locate_pkg.sub.qqqqqq': 'zz_locate_pkg.sub' has no attribute 'qqqqqq'"
    )


@pytest.mark.parametrize("name", ["", ".sub", 5, None])
def test_what_is_not_a_dotted_path(name):
    with pytest.raises(ImportError, match="expected a dotted import path"):
        locate(name)


class Model:
    @configurable
    def __init__(self, hidden, layers=2, *, act="gelu"):
        self.hidden = hidden


def test_init_signature_is_init_without_self():
    assert str(init_signature(Model)) == "(hidden, layers=2, *, act='gelu')"
