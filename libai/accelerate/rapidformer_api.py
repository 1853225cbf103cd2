"""Rapidformer's API names on libai's accelerate door, as its documented scripts import them
(``from rapidformer import RapidformerEngine, get_args, Finetuner, ...``; inside a
``libai-accelerate --user-script`` the names are importable as ``rapidformer`` and
``megatron`` / ``megatron.mpu``, see :mod:`libai.accelerate.user_script`)."""

from __future__ import annotations

import logging
import time

from libai.accelerate.arguments import build_parser, parse_args
from libai.accelerate.engine import AccelerateEngine, current_engine
from libai.accelerate.pretraining import bert_pretraining_datasets, pretraining_tokenizer
from libai.accelerate.templates import Finetuner, PreTrainer

__all__ = [
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

#: Rapidformer spells it both ways
Pretrainer = PreTrainer


class RapidformerEngine(AccelerateEngine):
    """Rapidformer's engine: the command line's flags (``sys.argv``, or the words
    ``libai-accelerate --user-script`` was given) plus the script's own, added by
    ``extra_args_provider(parser)`` (Megatron's contract: it returns the parser).

    Args:
        extra_args_provider: adds flags to the parser (``parser.add_argument_group(...)``).
        args: as :class:`AccelerateEngine` (a list of words, a namespace or a dict);
            ``None``: the command line.
    """

    def __init__(self, extra_args_provider=None, args=None):
        if extra_args_provider is not None and (args is None or isinstance(args, list)):
            parser = build_parser()
            parser = extra_args_provider(parser) or parser
            args = parse_args(args, parser)
        super().__init__(args)


def get_args():
    """The parsed flags of the engine created last (Megatron's global ``args``), with
    Megatron's names (``mask_prob``, ``short_seq_prob``, ``mmap_warmup``, ``data_impl``,
    ``split``, ``dataset_path``, ...)."""
    engine = current_engine()
    if engine is None:
        raise RuntimeError("get_args() before RapidformerEngine(): create the engine first")
    return engine.args


def get_logger() -> logging.Logger:
    """The logger user scripts write to (configured like libai's: rank 0 to the console and
    ``--save``'s log file)."""
    return logging.getLogger("libai.accelerate.user")


def get_tokenizer():
    """The tokenizer of the flags: ``--tokenizer-type`` on ``--vocab-file`` (/
    ``--merge-file``), else ``--pretrained-model-name-or-path``'s (transformers')."""
    engine = current_engine()
    args = get_args()
    if getattr(engine, "_flags_tokenizer", None) is None:
        engine._flags_tokenizer = pretraining_tokenizer(args)
    return engine._flags_tokenizer


class _Timer:
    def __init__(self, name: str):
        self.name, self.elapsed_, self.started, self._start = name, 0.0, False, 0.0

    def start(self):
        if self.started:
            raise RuntimeError(f"timer {self.name} has already been started")
        self._start, self.started = time.perf_counter(), True

    def stop(self):
        if not self.started:
            raise RuntimeError(f"timer {self.name} is not started")
        self.elapsed_ += time.perf_counter() - self._start
        self.started = False

    def reset(self):
        self.elapsed_, self.started = 0.0, False

    def elapsed(self, reset: bool = True) -> float:
        """Seconds accumulated (a running timer counts up to now); then reset."""
        running = self.started
        if running:
            self.stop()
        value = self.elapsed_
        if reset:
            self.reset()
        if running:
            self.start()
        return value


class Timers:
    """Megatron's named timers: ``timers("forward").start()`` / ``.stop()``,
    ``timers.log(["forward"])`` (milliseconds, to :func:`get_logger`)."""

    def __init__(self):
        self.timers: dict[str, _Timer] = {}

    def __call__(self, name: str) -> _Timer:
        if name not in self.timers:
            self.timers[name] = _Timer(name)
        return self.timers[name]

    def log(self, names, normalizer: float = 1.0, reset: bool = True) -> str:
        text = "time (ms)" + "".join(
            f" | {n}: {self.timers[n].elapsed(reset=reset) * 1000.0 / normalizer:.2f}"
            for n in names
            if n in self.timers
        )
        get_logger().info(text)
        return text


_TIMERS = Timers()


def get_timers() -> Timers:
    """The process's :class:`Timers`."""
    return _TIMERS


def build_train_valid_test_datasets_for_huggingface(
    data_prefix,
    data_impl: str,
    splits_string: str,
    train_valid_test_num_samples,
    max_seq_length: int,
    masked_lm_prob: float,
    short_seq_prob: float,
    seed: int,
    skip_warmup: bool,
    binary_head: bool = True,
):
    """Rapidformer's BERT samples for a Hugging Face model: ``(train, valid, test)`` masked-LM
    (+ next-sentence with ``binary_head``) samples of Megatron's sentence-indexed data
    ``data_prefix`` (``tools/preprocess_data.py --split-sentences``), split by
    ``splits_string``, in transformers' names (``input_ids``, ``attention_mask``,
    ``token_type_ids``, ``labels``, ``next_sentence_label``), tokenized by
    :func:`get_tokenizer`. ``data_prefix`` may be Megatron's list ``[prefix]``."""
    if isinstance(data_prefix, (list, tuple)):
        if len(data_prefix) != 1:
            raise ValueError(
                f"data_prefix {data_prefix}: one prefix (blends of several are not supported)"
            )
        data_prefix = data_prefix[0]
    return bert_pretraining_datasets(
        str(data_prefix),
        get_tokenizer(),
        data_impl=data_impl,
        splits_string=splits_string,
        train_valid_test_num_samples=list(train_valid_test_num_samples),
        max_seq_length=max_seq_length,
        masked_lm_prob=masked_lm_prob,
        short_seq_prob=short_seq_prob,
        seed=seed,
        skip_warmup=skip_warmup,
        binary_head=binary_head,
    )
