"""LiBai's path of the mesh and rank helpers (``from libai.utils import distributed as dist``):
an alias of :mod:`libai.dist`, the same module object."""

import sys

import libai.dist as _dist

sys.modules[__name__] = _dist
