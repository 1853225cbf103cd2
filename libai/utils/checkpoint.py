"""LiBai's path of the checkpointer (``from libai.utils.checkpoint import Checkpointer``): an
alias of :mod:`libai.checkpoint.checkpointer`, the same module object."""

import sys

from libai.checkpoint import checkpointer as _checkpointer

sys.modules[__name__] = _checkpointer
