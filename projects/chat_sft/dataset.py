"""Chat SFT samples: JSON-lines conversations rendered with the model's chat template.

Every non-blank line of the data file is one conversation in the OpenAI / Hugging Face
``messages`` format::

    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What is 2 plus 3?"},
                  {"role": "assistant", "content": "5."}]}

The conversation is rendered with the chat template (:mod:`projects.chat_sft.chat_template`)
and tokenized as a whole, exactly as ``tokenizer.apply_chat_template(messages)`` does (no
special tokens are added beyond what the template writes). Only assistant turns are learned:
``labels`` holds the ids of each assistant reply *and the end-of-turn token after it* (so the
model learns to stop) and -100 everywhere else: system and user turns, role headers, the
generation prompt, the newline between turns and the padding. Every assistant turn of a
multi-turn conversation is learned. Labels are not shifted (the causal LM shifts inside).
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right

import numpy as np
import torch

from libai.data.datasets.lm_utils import IGNORE_INDEX, pad_to
from libai.data.datasets.sft_dataset import read_json_lines
from libai.utils.logger import log_first_n
from projects.chat_sft.chat_template import ChatTemplateError, load_chat_template

# under "libai" so that the trainer's log handlers (console, log.txt) show these lines
logger = logging.getLogger("libai.projects.chat_sft")

ROLES = ("system", "user", "assistant")
SAMPLE_HINT = "python projects/chat_sft/sample_data.py output/chat_sample writes a sample"


def check_conversation(record, where: str, messages_key: str = "messages") -> list[dict]:
    """The messages of one JSON record, checked.

    Raises:
        ValueError: the record is not an object, lacks ``messages_key``, holds no list of
            messages there, a message has no / an unknown ``role`` or a non-string
            ``content``, or no message is the assistant's. The message starts with ``where``.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object per line, got {type(record).__name__}.")
    if messages_key not in record:
        raise ValueError(
            f"{where}: no {messages_key!r} field (the record has {sorted(record)}); each line "
            f'must be {{"{messages_key}": [{{"role": ..., "content": ...}}, ...]}}.'
        )
    messages = record[messages_key]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: {messages_key!r} must be a non-empty list of messages.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}: message {i} is {type(message).__name__}, not an object.")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(
                f"{where}: message {i} has role {role!r}; the roles are {list(ROLES)}."
            )
        if not isinstance(message.get("content"), str):
            raise ValueError(
                f"{where}: message {i} ({role}) needs a string 'content', got "
                f"{type(message.get('content')).__name__}."
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(
            f"{where}: the conversation has no assistant message, so nothing would be learned; "
            "add the assistant's reply or drop the line."
        )
    return messages


def read_conversations(path: str, messages_key: str = "messages") -> list[tuple[str, list]]:
    """``(file:line, messages)`` of every non-blank line of a JSON-lines file, checked."""
    return [
        (where, check_conversation(record, where, messages_key))
        for where, record in read_json_lines(path)
    ]


def label_spans(ids, offsets, spans) -> np.ndarray:
    """``ids`` with -100 on every token that does not start inside one of ``spans``
    (sorted, disjoint ``[start, end)`` character ranges)."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    starts = [s for s, _ in spans]
    for j, (token_id, (begin, _)) in enumerate(zip(ids, offsets)):
        k = bisect_right(starts, begin) - 1
        if k >= 0 and begin < spans[k][1]:
            labels[j] = token_id
    return labels


class ChatSFTDataset(torch.utils.data.Dataset):
    """Conversations for supervised fine-tuning of a chat model (see the module docstring).

    Args:
        data_path: the JSON-lines file of ``{"messages": [...]}`` records.
        tokenizer: a libai tokenizer backed by a ``tokenizer.json``
            (:class:`libai.tokenizer.JsonTokenizer`); its directory's chat template is used.
        max_seq_length: length of every sample; longer conversations are cut at the end.
        chat_template: ``None`` (the checkpoint's, else the built-in ChatML),
            ``"checkpoint"`` (the checkpoint's, required), ``"chatml"``, a ``.jinja`` file or
            Jinja text (see :func:`projects.chat_sft.chat_template.load_chat_template`).
        end_of_turn: the text after a reply that is learned with it; ``None``: what the
            template writes there, trailing whitespace removed (ChatML's ``<|im_end|>``).
        messages_key: the field holding the messages.

    ``dataset[i]`` is ``{"input_ids", "attention_mask", "labels"}``, ``torch.long``
    ``[max_seq_length]`` each; padding uses the tokenizer's pad id, else its eos id.

    Raises:
        FileNotFoundError: ``data_path`` does not exist.
        ValueError: a malformed record (``file:line`` and the field in the message), an empty
            file, or a template problem (:class:`ChatTemplateError`).
    """

    def __init__(
        self,
        data_path,
        tokenizer,
        max_seq_length: int = 2048,
        chat_template: str | None = None,
        end_of_turn: str | None = None,
        messages_key: str = "messages",
    ):
        self.data_path = os.fspath(data_path)
        if not os.path.isfile(self.data_path):
            raise FileNotFoundError(
                f"chat data file not found: {self.data_path} does not exist. Set "
                f"dataloader.train.dataset.0.data_path to a JSON-lines file ({SAMPLE_HINT})."
            )
        if int(max_seq_length) < 2:
            raise ValueError(f"max_seq_length must be >= 2, got {max_seq_length}.")
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.template = load_chat_template(tokenizer, chat_template, end_of_turn)
        self.conversations = read_conversations(self.data_path, messages_key)
        if not self.conversations:
            raise ValueError(f"chat data file {self.data_path} holds no conversations.")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            self.pad_id = 0
        self.encode(0)  # a template that cannot render this data fails now, not in a worker
        logger.info(
            "%d conversations from %s, rendered with %s; learned: assistant replies + %r",
            len(self.conversations),
            self.data_path,
            self.template.name,
            self.template.end_of_turn_text(self.conversations[0][1]),
        )

    def __len__(self) -> int:
        return len(self.conversations)

    def encode(self, idx: int) -> tuple[list[int], np.ndarray]:
        """``(ids, labels)`` of conversation ``idx`` before truncation and padding."""
        where, messages = self.conversations[idx]
        try:
            text, spans = self.template.render_with_spans(messages)
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{where}: {e}") from e
        ids, offsets = self.tokenizer.encode_with_offsets(text, add_special_tokens=False)
        return ids, label_spans(ids, offsets, spans)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        ids, labels = self.encode(idx)
        n = min(len(ids), self.max_seq_length)
        ids, labels = np.asarray(ids[:n], dtype=np.int64), labels[:n]
        if not (labels != IGNORE_INDEX).any():
            where = self.conversations[idx][0]
            log_first_n(
                logging.WARNING,
                f"{where}: no assistant token within max_seq_length={self.max_seq_length}; "
                "the sample carries no loss",
                name=logger.name,
            )
        return {
            "input_ids": pad_to(ids, self.max_seq_length, self.pad_id),
            "attention_mask": pad_to(np.ones(n, np.int64), self.max_seq_length, 0),
            "labels": pad_to(labels, self.max_seq_length, IGNORE_INDEX),
        }
