"""The offline evaluation sets of FleetX's ``GPTEvalModule`` (``Offline_Eval``), on local
files: WikiText perplexity (``LM_Eval_Dataset``) and LAMBADA last-word accuracy
(``Lambada_Eval_Dataset``).

Every sample is a dict of ``max_seq_len``-long rows: ``input_ids``, ``position_ids``,
``labels`` (the next tokens), ``loss_mask`` (1 on the targets that count) and ``info``.

- WikiText: the file's text, detokenized (:func:`wikitext_detokenize`), tokenized as one
  stream and cut into windows of ``max_seq_len + 1`` tokens that start every
  ``overlapping_eval`` tokens; window 0 scores all its targets, a later one only its last
  ``overlapping_eval`` (the earlier ones are context), so every target of the stream is
  scored exactly once. The padding of the last window is not scored (FleetX means to mask
  it too, but its ``tokens == pad`` compares a Python list with a number and masks
  nothing). ``info = [words in the file, tokens of the stream]`` for the adjusted
  perplexity.
- LAMBADA: one JSON object per line with ``text``; the context is the text before its last
  word, the target the tokens of ``" " + last word``; ``loss_mask`` marks the target
  positions. ``info = [number of examples]``. A context too long for the window keeps its
  last tokens.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import torch

__all__ = ["LMEvalDataset", "LambadaEvalDataset", "wikitext_detokenize"]

#: WikiText's tokenization undone: (pattern, replacement), applied in order
_PLAIN = [
    ("s '", "s'"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
    (" : ", ": "),
    (" ; ", "; "),
    (" . ", ". "),
    (" ! ", "! "),
    (" ? ", "? "),
    (" , ", ", "),
]
_BRACKETS = [
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)"),
    (r"\[\s*([^\]]*?)\s*\]", r"[\1]"),
    (r"{\s*([^}]*?)\s*}", r"{\1}"),
    (r"\"\s*([^\"]*?)\s*\"", r'"\1"'),
    (r"'\s*([^']*?)\s*'", r"'\1'"),
]
_AFTER = [
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),
    (" " + chr(176) + " ", chr(176)),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
]


def wikitext_detokenize(text: str) -> str:
    """WikiText's spaced punctuation, ``@-@`` number separators and ``= =`` headings joined
    back into plain text (the detokenizer Megatron-LM and FleetX evaluate with)."""
    text = text.replace(_PLAIN[0][0], _PLAIN[0][1])
    text = re.sub(r"/' [0-9]/", r"/'[0-9]/", text)
    for old, new in _PLAIN[1:]:
        text = text.replace(old, new)
    for pattern, new in _BRACKETS:
        text = re.sub(pattern, new, text)
    for old, new in _AFTER:
        text = text.replace(old, new)
    return text


def _eos(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the evaluation sets pad with the tokenizer's eos token; it has none")
    return int(eos)


def _sample(tokens: list[int], mask: np.ndarray, info) -> dict[str, torch.Tensor]:
    ids = torch.tensor(tokens, dtype=torch.long)
    return {
        "input_ids": ids[:-1],
        "position_ids": torch.arange(len(tokens) - 1),
        "labels": ids[1:],
        "loss_mask": torch.from_numpy(mask),
        "info": torch.tensor(info, dtype=torch.long),
    }


class LMEvalDataset(torch.utils.data.Dataset):
    """WikiText-style perplexity windows over the text file ``input_dir`` (FleetX's key
    name for the path); see the module doc. ``tokenizer`` is the task module's."""

    def __init__(
        self,
        input_dir: str,
        max_seq_len: int,
        overlapping_eval: int | None = None,
        tokenizer=None,
        model_type: str = "GPT",
    ):
        if tokenizer is None:
            raise ValueError("LM_Eval_Dataset needs the module's tokenizer")
        with open(input_dir, "rb") as f:
            text = f.read().decode("utf-8")
        self.num_original_tokens = len(text.strip().split(" "))
        self.tokens = list(tokenizer.encode(wikitext_detokenize(text)))
        self.num_tokenized_tokens = len(self.tokens)
        self.seq_len, self.pad = int(max_seq_len), _eos(tokenizer)
        stride = self.seq_len if overlapping_eval is None else int(overlapping_eval)
        self.stride = max(1, stride)
        targets = max(self.num_tokenized_tokens - 1 - self.stride, 0)
        self.total_sequences = max(math.ceil(targets / self.stride) + 1, 1)

    def __len__(self) -> int:
        return self.total_sequences

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        start = idx * self.stride
        window = self.tokens[start : start + self.seq_len + 1]
        real = len(window) - 1  # targets in this window
        tokens = window + [self.pad] * (self.seq_len + 1 - len(window))
        mask = np.zeros(self.seq_len, dtype=np.float32)
        mask[: max(real, 0)] = 1.0
        if idx > 0 and self.stride != self.seq_len:
            mask[: -self.stride] = 0.0  # context already scored by earlier windows
        return _sample(tokens, mask, [self.num_original_tokens, self.num_tokenized_tokens])


class LambadaEvalDataset(torch.utils.data.Dataset):
    """LAMBADA last-word examples from the JSON-lines file ``input_dir``; see the module
    doc. ``strict``: the target is the tokens of the last word (FleetX's default)."""

    def __init__(self, input_dir: str, max_seq_len: int, tokenizer=None, model_type: str = "GPT"):
        if tokenizer is None:
            raise ValueError("Lambada_Eval_Dataset needs the module's tokenizer")
        self.seq_len, self.pad = int(max_seq_len), _eos(tokenizer)
        self.examples = []
        with open(input_dir, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                text = json.loads(line).get("text")
                if not text or not text.split():
                    raise ValueError(f"{input_dir}:{lineno}: a LAMBADA line needs a 'text'")
                last = text.split()[-1]
                context = tokenizer.encode(text[: text.rfind(last)].strip())
                self.examples.append((list(context), list(tokenizer.encode(" " + last))))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        context, target = self.examples[idx]
        if len(target) > self.seq_len:
            raise ValueError(f"LAMBADA example {idx}: its last word exceeds max_seq_len")
        context = context[-(self.seq_len + 1 - len(target)) :]
        tokens = context + target
        n = len(tokens)
        tokens += [self.pad] * (self.seq_len + 1 - n)
        mask = np.zeros(self.seq_len, dtype=np.float32)
        mask[n - len(target) - 1 : n - 1] = 1.0
        return _sample(tokens, mask, [len(self)])
