"""Extractive question answering (run_qa: offset mapping to token positions, one feature
per example)."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import torch

from libai.accelerate.tasks.common import (
    CHUNK,
    MODEL_INPUTS,
    N_BEST,
    Prepared,
    Task,
    TensorDictDataset,
    add_to_sums,
    check_columns,
    column_texts,
    ensure_pad_token,
    long_tensor,
    named_splits,
    ratio,
    require_fast_tokenizer,
    seq_length_setting,
    span_scores,
    task_setting,
)

logger = logging.getLogger(__name__)


class QuestionAnswering(Task):
    """SQuAD columns -> ``start_positions`` / ``end_positions`` of the first answer (run_qa's
    offset-mapping search, inside the context tokens); question first, ``only_second``
    truncation, ONE feature per example (no doc stride): an answer cut off by ``seq_length``
    (or an empty answer list) gets (0, 0). A question too long for ``seq_length`` falls back
    to ``longest_first`` truncation (logged) instead of failing.

    Metrics on token spans, in percent: the prediction is the best ``start + end`` logit pair
    among the top-20 starts and ends with ``start <= end`` inside the context and at most
    ``max_answer_length`` tokens ((0, 0) when none is valid); ``exact_match`` = same span,
    ``f1`` = token-overlap F1 of the spans (a (0, 0) gold scores 1 only for a (0, 0)
    prediction). This is NOT SQuAD's metric on normalized answer text, which needs the text
    post-processing of run_qa: span scores are usually close to, not equal to, it."""

    name = "question_answering"
    auto_model = "AutoModelForQuestionAnswering"
    metrics = ("exact_match", "f1")

    def __init__(self):
        self.max_answer_length = 30
        self.special_ids: set[int] = set()
        self.context_spans: dict[bytes, tuple[int, int]] = {}

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = seq_length_setting(args)
        columns = [
            task_setting(args, "question_column", "question"),
            task_setting(args, "context_column", "context"),
            task_setting(args, "answers_column", "answers"),
        ]
        self.max_answer_length = int(task_setting(args, "max_answer_length", 30))
        require_fast_tokenizer(tokenizer, self.name)
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, columns, hint)
        model_kwargs: dict = {}
        ensure_pad_token(tokenizer, model_kwargs)
        self.special_ids = set(tokenizer.all_special_ids)
        self.context_spans = {}
        out = []
        for split, (dataset, hint) in enumerate(splits):
            questions = [q.lstrip() for q in column_texts(dataset, columns[0], hint)]
            contexts = column_texts(dataset, columns[1], hint)
            answers = list(dataset[columns[2]])
            tensors: dict[str, list] = {}
            for lo in range(0, len(questions), CHUNK):
                hi = lo + CHUNK
                for enc, i, answer in zip(
                    *self._encode(tokenizer, questions[lo:hi], contexts[lo:hi], seq_length),
                    answers[lo:hi],
                ):
                    sequence_ids = enc.sequence_ids(i)
                    context = [k for k, s in enumerate(sequence_ids) if s == 1]
                    span = (context[0], context[-1]) if context else None
                    start, end = _answer_positions(enc["offset_mapping"][i], span, answer, hint)
                    for key in MODEL_INPUTS:
                        if key in enc:
                            tensors.setdefault(key, []).append(enc[key][i])
                    tensors.setdefault("start_positions", []).append(start)
                    tensors.setdefault("end_positions", []).append(end)
                    if split == 1:
                        self.context_spans[_row_key(enc["input_ids"][i])] = span or (0, 0)
            out.append(TensorDictDataset({k: long_tensor(v) for k, v in tensors.items()}))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)

    @staticmethod
    def _encode(tokenizer, questions, contexts, seq_length):
        """``(encodings, row indices)``: one call for the chunk, or row by row when a question
        leaves no room for the context (``longest_first`` for those rows)."""
        common = dict(max_length=seq_length, padding="max_length", return_offsets_mapping=True)
        try:
            enc = tokenizer(questions, contexts, truncation="only_second", **common)
            return [enc] * len(questions), list(range(len(questions)))
        except Exception:  # the Rust tokenizer raises a bare Exception on truncation errors
            pass
        encodings, cut = [], 0
        for question, context in zip(questions, contexts):
            try:
                enc = tokenizer([question], [context], truncation="only_second", **common)
            except Exception:
                enc = tokenizer([question], [context], truncation="longest_first", **common)
                cut += 1
            encodings.append(enc)
        if cut:
            logger.warning(
                "%d question(s) leave no room for their context in seq_length %d: truncated "
                "longest_first",
                cut,
                seq_length,
            )
        return encodings, [0] * len(questions)

    def _context_span(self, input_ids: torch.Tensor) -> tuple[int, int]:
        """Context token range of a validation row (recorded by prepare); for other rows, the
        second run of non-special tokens (the first when there is only one)."""
        span = self.context_spans.get(_row_key(input_ids.tolist()))
        if span is not None:
            return span
        runs, start = [], None
        for k, token in enumerate(input_ids.tolist() + [None]):
            special = token is None or token in self.special_ids
            if special and start is not None:
                runs.append((start, k - 1))
                start = None
            elif not special and start is None:
                start = k
        return runs[1] if len(runs) > 1 else runs[0] if runs else (0, 0)

    def update(self, sums: dict, batch: dict, outputs) -> None:
        start_logits = outputs["start_logits"].detach().float().cpu()
        end_logits = outputs["end_logits"].detach().float().cpu()
        k = min(N_BEST, start_logits.shape[-1])
        top_starts = start_logits.topk(k, dim=-1).indices.tolist()
        top_ends = end_logits.topk(k, dim=-1).indices.tolist()
        gold_starts = batch["start_positions"].reshape(-1).tolist()
        gold_ends = batch["end_positions"].reshape(-1).tolist()
        input_ids = batch["input_ids"].cpu()
        start_scores, end_scores = start_logits.tolist(), end_logits.tolist()
        for row in range(start_logits.shape[0]):
            lo, hi = self._context_span(input_ids[row])
            best, pred = None, (0, 0)
            for s in top_starts[row]:
                for e in top_ends[row]:
                    if not (lo <= s <= e <= hi and e - s < self.max_answer_length):
                        continue
                    score = start_scores[row][s] + end_scores[row][e]
                    if best is None or score > best:
                        best, pred = score, (s, e)
            em, f1 = span_scores(pred, (gold_starts[row], gold_ends[row]))
            add_to_sums(sums, "exact_match", em)
            add_to_sums(sums, "f1", f1)
            add_to_sums(sums, "count", 1)

    def compute(self, sums: dict) -> dict[str, float]:
        count = sums.get("count", 0.0)
        return {
            "exact_match": 100.0 * ratio(sums.get("exact_match", 0.0), count),
            "f1": 100.0 * ratio(sums.get("f1", 0.0), count),
        }


def _row_key(input_ids: list[int]) -> bytes:
    return hashlib.blake2b(np.asarray(input_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def _answer_positions(offsets, context, answer, hint: str) -> tuple[int, int]:
    """run_qa's token positions of the first answer, searched inside the context tokens
    ``context = (first, last)``; (0, 0) when there is none or it is cut off."""
    if isinstance(answer, (list, tuple)):  # [{"text": ..., "answer_start": ...}, ...]
        answer = answer[0] if answer else {}
        answer = {"text": [answer.get("text")], "answer_start": [answer.get("answer_start")]}
    if not isinstance(answer, dict):
        raise ValueError(f"{hint}: answers must be {{'text': [...], 'answer_start': [...]}}")
    texts, starts = answer.get("text") or [], answer.get("answer_start") or []
    if not texts or not starts or texts[0] is None or starts[0] is None or context is None:
        return 0, 0
    first, last = context
    start_char = int(starts[0])
    end_char = start_char + len(texts[0])
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return 0, 0
    start = first
    while start < last and offsets[start + 1][0] <= start_char:
        start += 1
    end = last
    while end > start and offsets[end - 1][1] >= end_char:
        end -= 1
    return start, end
