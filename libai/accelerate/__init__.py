"""Rapidformer's front door: accelerate an unmodified Hugging Face model on libai's core.

Three ways in, one execution core (the mesh, ``ModelRunner``, the training loop, hooks,
checkpoints and writers of :mod:`libai.engine`):

1. **Black box**: ``libai-accelerate --task TASK --pretrained-model-name-or-path DIR
   --data-path FILE ... [--mixed-precision] [--zero-1-memory-optimization] ...``
   (also ``python tools/libai_accelerate.py``; ``bash tools/train.sh tools/libai_accelerate.py - N ...``
   on N processes and several nodes); see :mod:`libai.accelerate.cli`.
2. **Templates**: subclass :class:`Finetuner` / :class:`PreTrainer` (Rapidformer's contract)
   and call ``train()``, or pass the file with ``--user-script``.
3. **compose**: ``AccelerateEngine(...).compose(model, ...)`` for a loop of your own.

Rapidformer's names (``RapidformerEngine``, ``get_args``, ``Pretrainer``,
``build_train_valid_test_datasets_for_huggingface``, ...) are here too, and importable as
``rapidformer`` / ``megatron.mpu`` inside ``--user-script`` files
(:mod:`libai.accelerate.user_script`).

``transformers`` and ``datasets`` are needed here (``pip install -e ".[accelerate]"``).
"""

from libai.accelerate.engine import AccelerateEngine
from libai.accelerate.rapidformer_api import (
    Pretrainer,
    RapidformerEngine,
    build_train_valid_test_datasets_for_huggingface,
    get_args,
    get_logger,
    get_timers,
    get_tokenizer,
)
from libai.accelerate.templates import Finetuner, PreTrainer

__all__ = [
    "AccelerateEngine",
    "Finetuner",
    "PreTrainer",
    "Pretrainer",
    "RapidformerEngine",
    "build_train_valid_test_datasets_for_huggingface",
    "get_args",
    "get_logger",
    "get_timers",
    "get_tokenizer",
]
