"""``get_config``: load a config file shipped with libai (the repository's ``configs/``)."""

from __future__ import annotations

import os
from pathlib import Path

from libai.config.lazy import LazyConfig

__all__ = ["get_config", "get_config_path"]


def _configs_root() -> Path:
    """``libai/config/configs`` (a symlink to ``configs/`` in a checkout or an editable
    install, a copy in a wheel), else ``configs/`` next to the ``libai`` package."""
    here = Path(__file__).resolve().parent
    for root in (here / "configs", here.parent.parent / "configs"):
        if root.is_dir():
            return root
    raise FileNotFoundError(
        f"libai's configs directory was not found (looked in {here / 'configs'} and "
        f"{here.parent.parent / 'configs'}); reinstall libai with `pip install -e .`"
    )


def get_config_path(config_path: str) -> str:
    """Absolute path of a packaged config, e.g. ``get_config_path("common/train.py")``."""
    root = _configs_root()
    path = root / config_path
    if not path.is_file():
        available = sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".py", ".yaml")
        )
        raise FileNotFoundError(
            f"{config_path} is not a config packaged with libai; available: "
            f"{', '.join(available) or 'none'}"
        )
    return os.fspath(path)


def get_config(config_path: str):
    """Load a packaged config: ``get_config("common/models/gpt.py").model``.

    Run from a LiBai checkout (a working directory whose ``configs/`` holds the file), the
    checkout's own file is the one loaded, as LiBai's ``get_config`` reads its checkout's
    (its projects build on LiBai's ``common/data/imagenet.py``, not this package's)."""
    checkout = Path.cwd() / "configs" / config_path
    if checkout.is_file():
        return LazyConfig.load(os.fspath(checkout))
    return LazyConfig.load(get_config_path(config_path))
