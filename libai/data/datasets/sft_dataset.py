"""Instruction tuning (SFT) samples from a JSON-lines file.

Every non-blank line is a JSON object with an instruction, an optional input and a
response, e.g. ``{"instruction": "Add the numbers.", "input": "2, 3", "output": "5"}``
(``prompt`` / ``response`` are accepted as field names too, and the names are
configurable). The prompt is the template filled with the instruction and input; the
sample is ``tokens(prompt) + tokens(response) + [eos]``, cut to ``max_seq_length`` and padded.
Only the response is learned: ``labels`` is ``input_ids`` with the prompt and the padding set
to -100, *not* shifted (the causal LM shifts inside, as in ``transformers``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from string import Formatter

import numpy as np
import torch

from libai.data.datasets.lm_utils import IGNORE_INDEX, pad_to

#: prompt of a record with an input (Alpaca's layout)
DEFAULT_PROMPT_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
#: prompt of a record without an input
DEFAULT_PROMPT_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
_FIELDS = ("instruction", "input")


def read_json_lines(path: str) -> Iterator[tuple[str, dict]]:
    """``("file:line", object)`` of every non-blank line of a JSON-lines file; a line that is
    not valid JSON or not an object raises a ``ValueError`` naming the file and line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e}).") from None
            if not isinstance(data, dict):
                raise ValueError(
                    f"{where}: expected a JSON object per line, got {type(data).__name__}."
                )
            yield where, data


def _names(key) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _first_id(tokenizer, names: Sequence[str]) -> int | None:
    for name in names:
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return None


def _check_template(template: str, what: str) -> str:
    try:
        fields = {f for _, f, _, _ in Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise ValueError(f"{what} {template!r} is not a valid format string: {e}") from None
    unknown = fields - set(_FIELDS)
    if unknown:
        raise ValueError(
            f"{what} {template!r} uses unknown placeholders {sorted(unknown)}; use "
            "{instruction} and {input} (write {{ and }} for literal braces)."
        )
    return template


class SFTDataset(torch.utils.data.Dataset):
    """Prompt/response samples for supervised fine-tuning of a causal LM.

    Args:
        data_path: the JSON-lines file.
        tokenizer: any object with ``encode(text) -> list[int]`` and an end-of-sequence id
            ``eos`` (``eod`` / ``eos_token_id`` also work); padding uses ``pad`` (or
            ``pad_token_id``), else the eos id (padding carries no loss either way).
        max_seq_length: length of every sample; longer ones are cut at the end.
        prompt_template: format string with ``{instruction}`` and ``{input}``.
        prompt_template_no_input: used when the input is missing or empty (``None``: always
            ``prompt_template``).
        instruction_key: field name(s) of the instruction; the first present is used.
        input_key: field name(s) of the optional input.
        output_key: field name(s) of the response.
        add_bos: start every sample with ``tokenizer.bos`` (or ``bos_token_id``).
        add_eos: end the response with the eos id.

    ``dataset[i]`` is ``{"input_ids", "attention_mask", "labels"}``, ``torch.long``
    ``[max_seq_length]`` each. The records are read and checked when the dataset is built;
    they are tokenized when read.

    Raises:
        FileNotFoundError: ``data_path`` does not exist.
        ValueError: a line is not a JSON object, or lacks a field or holds a non-string
            there (the message gives ``file:line`` and the field).
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        max_seq_length: int = 1024,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        prompt_template_no_input: str | None = DEFAULT_PROMPT_TEMPLATE_NO_INPUT,
        instruction_key: str | Sequence[str] = ("instruction", "prompt"),
        input_key: str | Sequence[str] = ("input",),
        output_key: str | Sequence[str] = ("output", "response"),
        add_bos: bool = False,
        add_eos: bool = True,
    ):
        self.data_path = os.fspath(data_path)
        if not os.path.isfile(self.data_path):
            raise FileNotFoundError(f"SFT data file not found: {self.data_path} does not exist.")
        if int(max_seq_length) < 1:
            raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}.")
        if not callable(getattr(tokenizer, "encode", None)):
            raise ValueError(
                f"SFTDataset needs a tokenizer with encode(text) -> list[int], got "
                f"{type(tokenizer).__name__}."
            )
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.prompt_template = _check_template(prompt_template, "prompt_template")
        self.prompt_template_no_input = (
            None
            if prompt_template_no_input is None
            else _check_template(prompt_template_no_input, "prompt_template_no_input")
        )
        self.instruction_key = _names(instruction_key)
        self.input_key = _names(input_key)
        self.output_key = _names(output_key)
        self.eos_id = _first_id(tokenizer, ("eos", "eod", "eos_token_id"))
        if add_eos and self.eos_id is None:
            raise ValueError(
                f"SFTDataset: the tokenizer {type(tokenizer).__name__} has no eos id (`eos`); "
                "set add_eos=False to train without one."
            )
        self.pad_id = _first_id(tokenizer, ("pad", "pad_token_id"))
        if self.pad_id is None:
            self.pad_id = self.eos_id if self.eos_id is not None else 0
        self.bos_id = _first_id(tokenizer, ("bos", "bos_token_id")) if add_bos else None
        if add_bos and self.bos_id is None:
            raise ValueError(f"SFTDataset: add_bos=True but {type(tokenizer).__name__} has no bos.")
        self.add_eos = bool(add_eos)
        #: ``(prompt, response)`` strings, one per record
        self.records = self._read()
        if not self.records:
            raise ValueError(f"SFT data file {self.data_path} holds no records.")

    def _field(self, data: dict, names: tuple[str, ...], where: str, required: bool) -> str:
        for name in names:
            if name in data and data[name] is not None:
                value = data[name]
                if not isinstance(value, str):
                    raise ValueError(
                        f"{where}: field {name!r} holds {type(value).__name__}, expected a string."
                    )
                return value
        if required:
            alternatives = " or ".join(repr(n) for n in names)
            raise ValueError(
                f"{where}: missing field {alternatives} (the line has the fields {sorted(data)})."
            )
        return ""

    def _read(self) -> list[tuple[str, str]]:
        records = []
        for where, data in read_json_lines(self.data_path):
            instruction = self._field(data, self.instruction_key, where, required=True)
            extra = self._field(data, self.input_key, where, required=False)
            output = self._field(data, self.output_key, where, required=True)
            records.append((self.format_prompt(instruction, extra), output))
        return records

    def format_prompt(self, instruction: str, input_text: str = "") -> str:
        """The prompt text of one record (its ``{instruction}`` and ``{input}`` filled)."""
        template = self.prompt_template
        if not input_text and self.prompt_template_no_input is not None:
            template = self.prompt_template_no_input
        return template.format(instruction=instruction, input=input_text)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        prompt, response = self.records[idx]
        prompt_ids = list(self.tokenizer.encode(prompt))
        if self.bos_id is not None:
            prompt_ids = [self.bos_id] + prompt_ids
        response_ids = list(self.tokenizer.encode(response))
        if self.add_eos:
            response_ids.append(self.eos_id)
        ids = np.asarray(prompt_ids + response_ids, dtype=np.int64)[: self.max_seq_length]
        labels = ids.copy()
        labels[: len(prompt_ids)] = IGNORE_INDEX
        n = len(ids)
        return {
            "input_ids": pad_to(ids, self.max_seq_length, self.pad_id),
            "attention_mask": pad_to(np.ones(n, np.int64), self.max_seq_length, 0),
            "labels": pad_to(labels, self.max_seq_length, IGNORE_INDEX),
        }
