"""What LiBai's ``BertModel`` gives and holds, in LiBai's shapes: its output pair and its
stack of encoder layers."""

from __future__ import annotations

from torch import nn

__all__ = ["EncoderLayers", "EncoderOutput"]


class EncoderOutput(tuple):
    """What :class:`BertModel` returns: LiBai's ``(encoder_output, pooled_output)`` pair
    (``pooled_output`` None without a pooler), also read by name as transformers does:
    ``out["last_hidden_state"]``, ``out["pooler_output"]`` (present names only), ``keys()``,
    ``items()``, ``in``."""

    NAMES = ("last_hidden_state", "pooler_output")

    def __new__(cls, hidden, pooled=None):
        return super().__new__(cls, (hidden, pooled))

    def __getitem__(self, key):
        if isinstance(key, str):
            value = dict(self.items()).get(key)
            if value is None:
                raise KeyError(key)
            return value
        return super().__getitem__(key)

    def __contains__(self, key):
        return key in self.keys() if isinstance(key, str) else super().__contains__(key)

    def keys(self):
        return [name for name, value in zip(self.NAMES, self) if value is not None]

    def items(self):
        return [(name, value) for name, value in zip(self.NAMES, self) if value is not None]

    def get(self, key, default=None):
        return self[key] if key in self.keys() else default


class EncoderLayers(nn.ModuleDict):
    """The encoder's layers keyed by layer index (a pipeline stage holds only its own, the
    names stay); iterating gives the layers in order, as LiBai's ``ModuleList`` does
    (``for layer in model.encoders``)."""

    def __iter__(self):
        return iter(self.values())
