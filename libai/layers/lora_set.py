"""Several LoRA adapters on one Linear (or token embedding), chosen per token: one adapter per request when a
server hosts many fine-tunes of one base.

The base weights are held once; each adapter keeps its own A and B beside them (a
:class:`~libai.layers.lora.LoRA`, laid out with the base exactly as for training). A packed
step mixes requests of different adapters: :class:`AdapterRouting` holds, for the step's
tokens, which adapter each uses (``-1``: the base alone), grouped once per step and shared
by every layer; :class:`AdapterSet` takes the place of ``linear.lora`` and adds, for each
adapter some token uses, that adapter's output on those tokens' rows only. Inference only:
the adapters are not trained here (:func:`libai.models.lora.apply_lora` trains one).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from libai.layers.lora import EmbeddingLoRA, LoRA


class AdapterRouting:
    """The adapter names (index ``i`` is ``names[i]``) and, during a forward, the rows of
    the step's tokens (the input's leading dims flattened) that each used adapter takes."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        #: ``(adapter index, row indices)`` for each adapter used by the current step, in
        #: index order (every rank of a layout walks them in the same order)
        self.groups: list[tuple[int, torch.Tensor]] = []
        #: the number of tokens the current step routes
        self.tokens = 0

    @contextmanager
    def route(self, slots: torch.Tensor):
        """Within the block, token ``t`` of the forward uses adapter ``slots[t]`` (``-1``:
        none)."""
        if slots.numel() and int(slots.max()) >= len(self.names):
            raise ValueError(
                f"adapter index {int(slots.max())} out of range: {len(self.names)} adapters "
                f"loaded ({', '.join(self.names)})"
            )
        used = torch.unique(slots[slots >= 0]).tolist()
        self.groups = [(i, _rows(slots == i)) for i in used]
        self.tokens = slots.numel()
        try:
            yield
        finally:
            self.groups = []


def _rows(mask: torch.Tensor) -> slice | torch.Tensor:
    """The rows ``mask`` selects: a slice when they are one run (the engine packs each
    adapter's sequences together), else their indices."""
    rows = mask.nonzero().flatten()
    first, last = int(rows[0]), int(rows[-1])
    return slice(first, last + 1) if last - first + 1 == rows.numel() else rows


class AdapterSet(nn.Module):
    """The adapters of one Linear (``adapters``: adapter index -> its :class:`LoRA`; a
    layer that some adapters do not target lacks those), routed by ``routing``."""

    def __init__(self, adapters: dict[int, LoRA | EmbeddingLoRA], routing: AdapterRouting):
        super().__init__()
        self.adapters = nn.ModuleDict({str(i): a for i, a in sorted(adapters.items())})
        self.routing = routing

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``out`` (the base's output for ``x``) plus, on each token's rows, its adapter's
        addition (in place)."""
        groups = self.routing.groups
        if not groups:
            return out
        # a Linear's input [..., in] or an embedding's ids [...]: one row per token
        rows_in = x.reshape(-1, *x.shape[out.dim() - 1 :])
        rows_out = out.view(-1, out.shape[-1])
        if rows_in.shape[0] != self.routing.tokens:
            raise ValueError(
                f"the adapters were routed for {self.routing.tokens} tokens, the layer got "
                f"{rows_in.shape[0]} (sequence parallel does not serve several adapters)"
            )
        for index, rows in groups:
            adapter = self.adapters[str(index)] if str(index) in self.adapters else None
            if adapter is None:  # this adapter leaves the layer as the base has it
                continue
            # [S(0) tokens of adapter i, B] -> the adapter (its own layout) -> the same rows
            if isinstance(rows, slice):  # one run of rows: views, no copies
                picked, target = rows_in[rows][None], rows_out[rows]
            else:
                picked, target = rows_in.index_select(0, rows)[None], None
            # a fused qkv projection's segments come in their rows
            delta = adapter(picked)[0].to(out.dtype)
            if target is not None:
                target += delta
            else:
                rows_out.index_add_(0, rows, delta)
        return out

    def delta_weight(self):
        raise ValueError(
            "a layer serving several adapters cannot merge them into one weight; merge one "
            "adapter (load it alone) instead"
        )

    def extra_repr(self) -> str:
        return "adapters=" + ", ".join(self.routing.names[int(i)] for i in self.adapters)
