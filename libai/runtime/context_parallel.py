"""The context-parallel transform of a batch: each rank keeps its head-tail share of every
sequence (:mod:`libai.layers.context_parallel`).

A model runs under ``train.dist.context_parallel_size > 1`` when it declares
``supports_context_parallel = True`` and names the batch keys whose dim 1 is the sequence
(``context_parallel_keys``); ``context_parallel_batch(batch)``, when the model defines it,
first puts the batch into a form where every such tensor is aligned with the input positions
(Llama moves its label shift there). The runner then cuts those tensors and adds the global
``position_ids`` of the share; masks over the keys (``attention_mask``) stay whole, since
every rank's queries attend to the whole sequence.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from libai.layers.context_parallel import check_context_split, shard_positions, shard_sequence


def check_context_parallel_support(model: nn.Module, layout, loss_fn=None) -> None:
    """Raise (before any collective) if ``layout`` splits sequences over cp and ``model``
    (or a custom ``loss_fn``) cannot run that way."""
    cp = layout.context_parallel_size
    if cp == 1:
        return
    if not getattr(model, "supports_context_parallel", False):
        raise ValueError(
            f"train.dist.context_parallel_size={cp}, but {type(model).__name__} does not "
            "support context parallelism (GPT-2 and Llama/Qwen2 do). Set "
            "train.dist.context_parallel_size=1 for this model."
        )
    if loss_fn is not None:
        raise ValueError(
            f"train.dist.context_parallel_size={cp} with a custom loss function (a task "
            "module's training_step) is not supported yet: the runner splits the model's own "
            "batch. Set train.dist.context_parallel_size=1."
        )


def shard_batch(model: nn.Module, batch: Mapping, util) -> dict:
    """This cp rank's share of ``batch``: the model's ``context_parallel_keys`` cut along
    the sequence (head-tail), ``position_ids`` added (the share's global positions) when the
    batch has none; every other entry as it is."""
    cp, rank = util.context_parallel_size, util.context_parallel_rank
    prepare = getattr(model, "context_parallel_batch", None)
    batch = dict(prepare(batch) if prepare is not None else batch)
    keys = [k for k in model.context_parallel_keys if isinstance(batch.get(k), torch.Tensor)]
    if not keys:
        raise ValueError(
            f"context parallel: the batch has none of {type(model).__name__}'s sequence keys "
            f"{list(model.context_parallel_keys)} (it has {sorted(batch)})"
        )
    seq_len = batch[keys[0]].shape[1]
    for key in keys:  # every rank checks, before any collective
        if batch[key].shape[1] != seq_len:
            raise ValueError(
                f"context parallel: batch[{key!r}] has {batch[key].shape[1]} positions, "
                f"batch[{keys[0]!r}] {seq_len}: the sequence keys must be equally long"
            )
    check_context_split(seq_len, cp)
    if "position_ids" not in batch:
        first = batch[keys[0]]
        positions = shard_positions(seq_len, cp, rank, first.device)
        # one row per sample (micro-batches split dim 0); already this rank's share
        batch["position_ids"] = positions.unsqueeze(0).expand(first.shape[0], -1)
    elif "position_ids" not in keys:
        keys.append("position_ids")
    for key in keys:
        batch[key] = shard_sequence(batch[key], cp, rank)
    return batch
