"""Configuration helpers."""

from libai.config.configurable import configurable

__all__ = ["configurable"]
