"""Incremental detokenization with stop strings, per sequence."""

from __future__ import annotations


class TextTracker:
    """The text of a sequence's generated tokens, released in pieces as they are safe to
    show: a piece is held back while it ends in an incomplete character (the tokenizer's
    replacement mark) or could be the start of a stop string. When a stop string appears,
    the text ends before it (OpenAI's rule) and :attr:`stopped` is set."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.text = ""
        self.sent = 0  # characters of ``text`` already released
        self.stopped = False

    def update(self, output_ids: list[int]) -> str:
        """Feed the sequence's tokens so far; returns the newly releasable text."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        for stop in self.stop:
            at = text.find(stop, max(0, self.sent - len(stop)))
            if at != -1:
                text, self.stopped = text[:at], True
        self.text = text
        end = len(text) if self.stopped else len(text) - self._held_back(text)
        piece, self.sent = text[self.sent : end], max(self.sent, end)
        return piece

    def flush(self) -> str:
        """The text still held back (the sequence has finished)."""
        piece, self.sent = self.text[self.sent :], len(self.text)
        return piece

    def _held_back(self, text: str) -> int:
        held = 1 if text.endswith("\ufffd") else 0
        for stop in self.stop:  # the longest tail that could still become a stop string
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if stop.startswith(text[-size:]):
                    held = max(held, size)
                    break
        return held
