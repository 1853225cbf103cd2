"""The head-tail layout and the per-share causal attention of context parallelism, against
their definitions and one process's attention over the whole sequence (no collectives:
the multi-rank runs are in tests/distributed/test_context_parallel.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from libai.layers.context_parallel import (
    causal_keep,
    causal_share_attention,
    check_context_split,
    shard_positions,
    shard_sequence,
)


def test_head_tail_positions_of_each_rank():
    """12 positions over cp 2: 4 chunks of 3; rank 0 holds chunks 0 and 3, rank 1 chunks
    1 and 2. Over cp 3 (6 chunks of 2) rank r holds chunks r and 5 - r."""
    assert shard_positions(12, 2, 0).tolist() == [0, 1, 2, 9, 10, 11]
    assert shard_positions(12, 2, 1).tolist() == [3, 4, 5, 6, 7, 8]
    assert shard_positions(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert shard_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert shard_positions(12, 3, 2).tolist() == [4, 5, 6, 7]
    for cp in (1, 2, 3, 6):  # every position held once
        held = torch.cat([shard_positions(12, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(12))


def test_a_sequence_that_does_not_split_is_refused_naming_the_fix():
    check_context_split(16, 4)
    with pytest.raises(ValueError, match=r"length 12 does not split over context_parallel_size=4"):
        check_context_split(12, 4)
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_sequence(torch.zeros(2, 12), 4, 0)


def test_shard_sequence_takes_the_positions_along_the_dim():
    x = torch.arange(2 * 8 * 3).view(2, 8, 3)
    share = shard_sequence(x, 2, 1)
    assert torch.equal(share, x[:, [2, 3, 4, 5]])
    assert torch.equal(shard_sequence(x, 1, 0), x)


def test_causal_keep_is_key_position_at_most_the_query_position():
    keep = causal_keep(torch.tensor([0, 5, 2]), 6)
    assert keep.tolist() == [
        [True, False, False, False, False, False],
        [True] * 6,
        [True, True, True, False, False, False],
    ]


@pytest.mark.parametrize("cp", [2, 3])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_shares_causal_attention_is_the_whole_sequences_at_its_rows(cp, kv_heads):
    """Each rank's queries against the whole sequence's keys (each chunk reading the keys up
    to its end) give the rows of one process's causal attention at the rank's positions;
    with grouped-query attention too."""
    g = torch.Generator().manual_seed(cp * 10 + kv_heads)
    seq = 4 * cp
    q = torch.randn(2, 4, seq, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, seq, 8, generator=g) for _ in range(2))
    gqa = kv_heads != 4
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    for rank in range(cp):
        positions = shard_positions(seq, cp, rank)
        share = causal_share_attention(q[:, :, positions], k, v, cp, rank, enable_gqa=gqa)
        torch.testing.assert_close(share, whole[:, :, positions], rtol=1e-5, atol=1e-6)
