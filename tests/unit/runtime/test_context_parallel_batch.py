"""The context-parallel cut of a batch (libai.runtime.context_parallel) against the head-tail
positions written out, and what context parallel refuses, one line each."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from libai import dist
from libai.models.llama_model import LlamaForCausalLM
from libai.runtime.context_parallel import check_context_parallel_support, shard_batch
from libai.runtime.zero import resolve_zero_stage

RANK1_OF_2 = types.SimpleNamespace(context_parallel_size=2, context_parallel_rank=1)
#: 8 positions over cp 2: chunks of 2, rank 1 holds chunks 1 and 2
RANK1_POSITIONS = [2, 3, 4, 5]


class Plain(nn.Module):
    supports_context_parallel = True
    context_parallel_keys = ("input_ids", "labels")


def test_the_sequence_keys_are_cut_and_the_positions_added():
    ids = torch.arange(16).view(2, 8)
    batch = {"input_ids": ids, "labels": ids + 100, "attention_mask": torch.ones(2, 8)}
    share = shard_batch(Plain(), batch, RANK1_OF_2)
    assert share["input_ids"].tolist() == [RANK1_POSITIONS, [p + 8 for p in RANK1_POSITIONS]]
    assert torch.equal(share["labels"], share["input_ids"] + 100)
    # one row of global positions per sample (micro-batches split dim 0)
    assert share["position_ids"].tolist() == [RANK1_POSITIONS] * 2
    assert share["attention_mask"].shape == (2, 8)  # over the keys: stays whole
    assert batch["input_ids"].shape == (2, 8)  # the caller's batch is not changed


def test_given_position_ids_are_cut_like_the_tokens():
    ids = torch.arange(8).view(1, 8)
    share = shard_batch(Plain(), {"input_ids": ids, "position_ids": ids * 10}, RANK1_OF_2)
    assert share["position_ids"].tolist() == [[p * 10 for p in RANK1_POSITIONS]]


def test_llama_shifts_its_labels_over_the_whole_sequence_before_the_cut():
    """Rank 0 holds positions 0, 1 and 6, 7: its position 1 is scored on token 2 (held by
    rank 1) and its last position on nothing (-100)."""
    ids = torch.arange(8).view(1, 8)
    model = types.SimpleNamespace(
        context_parallel_keys=LlamaForCausalLM.context_parallel_keys,
        context_parallel_batch=lambda b: LlamaForCausalLM.context_parallel_batch(None, b),
    )
    rank0 = types.SimpleNamespace(context_parallel_size=2, context_parallel_rank=0)
    share = shard_batch(model, {"input_ids": ids, "labels": ids.clone()}, rank0)
    assert "labels" not in share
    assert share["shift_labels"].tolist() == [[1, 2, 7, -100]]
    assert share["input_ids"].tolist() == [[0, 1, 6, 7]]


def test_a_batch_that_does_not_fit_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"batch\['labels'\] has 6 positions"):
        shard_batch(
            Plain(), {"input_ids": torch.zeros(1, 8), "labels": torch.zeros(1, 6)}, RANK1_OF_2
        )
    with pytest.raises(ValueError, match="multiple of 4"):
        shard_batch(Plain(), {"input_ids": torch.zeros(1, 6)}, RANK1_OF_2)
    with pytest.raises(
        ValueError, match=r"none of Plain's sequence keys \['input_ids', 'labels'\]"
    ):
        shard_batch(Plain(), {"tokens": torch.zeros(1, 8)}, RANK1_OF_2)


def test_a_model_without_context_parallel_or_a_custom_loss_is_refused():
    layout = types.SimpleNamespace(context_parallel_size=2)
    check_context_parallel_support(Plain(), layout)
    check_context_parallel_support(nn.Linear(2, 2), types.SimpleNamespace(context_parallel_size=1))
    with pytest.raises(ValueError, match="Linear does not support context parallelism"):
        check_context_parallel_support(nn.Linear(2, 2), layout)
    with pytest.raises(ValueError, match="custom loss function .* is not supported yet"):
        check_context_parallel_support(Plain(), layout, loss_fn=lambda batch: 0)


def test_every_zero_stage_shards_over_dp_and_cp_hsdp_with_cp_is_refused():
    layout = dist.resolve_layout({"context_parallel_size": 2}, 4)
    assert resolve_zero_stage({"enabled": True, "stage": 3}, layout) == 3
    with pytest.raises(ValueError, match=r"hsdp_replicate_size=2 \(HSDP\) with .*=2 is not"):
        resolve_zero_stage({"enabled": True, "stage": 3, "hsdp_replicate_size": 2}, layout)
    assert resolve_zero_stage({"enabled": False}, layout) is None
    assert resolve_zero_stage({"enabled": True, "stage": 2}, layout) == 2
    # one data-parallel rank but two context-parallel ones: two ranks hold the same state
    cp_only = dist.resolve_layout({"context_parallel_size": 2}, 2)
    assert resolve_zero_stage({"enabled": True, "stage": 1}, cp_only) == 1


def test_a_batch_of_ids_alone_gets_its_positions():
    """No labels (an evaluation or generation batch): the ids and their positions."""
    share = shard_batch(Plain(), {"input_ids": torch.arange(8).view(1, 8)}, RANK1_OF_2)
    assert share["input_ids"].tolist() == [RANK1_POSITIONS]
    assert share["position_ids"].tolist() == [RANK1_POSITIONS]


def test_positions_named_among_the_models_keys_are_cut_once():
    class WithPositions(Plain):
        context_parallel_keys = ("input_ids", "position_ids")

    ids = torch.arange(8).view(1, 8)
    share = shard_batch(WithPositions(), {"input_ids": ids, "position_ids": ids + 1}, RANK1_OF_2)
    assert share["position_ids"].tolist() == [[p + 1 for p in RANK1_POSITIONS]]
