"""The memory estimator's path of earlier releases (``libai.utils.memory_estimator``): an
alias of :mod:`libai.runtime.memory_estimator`, the same module object."""

import sys

from libai.runtime import memory_estimator as _memory_estimator

sys.modules[__name__] = _memory_estimator
