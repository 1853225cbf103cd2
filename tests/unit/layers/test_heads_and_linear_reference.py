"""The vocab-parallel cross entropy, ``Linear`` and the tied ``LMLogits`` head against
independent references, in one process.

Cross entropy is compared with ``torch.nn.functional.cross_entropy`` (ignore_index,
reductions) on the full logits; ``Linear`` with ``torch.nn.Linear`` / ``F.linear`` on the same
weights; the head's tied copy on another pipeline stage with the embedding a one-process build
draws from the same seed. Layouts that need several ranks (tensor, pipeline or data parallel)
are played by this process as one rank of a fake process group (no real collective runs):
only what a rank computes on its own is compared (shapes, shards, masks, errors, the
forward paths without communication).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from layer_helpers import randn, single_process  # noqa: F401 (single_process: an autouse fixture)
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from libai import dist
from libai.checkpoint.view import tied_weights
from libai.layers import Linear, LMLogits, ParallelCrossEntropyLoss, VocabEmbedding
from libai.layers.cross_entropy import vocab_parallel_cross_entropy
from libai.layers.lm_logits import enter_head
from libai.runtime.sequence_parallel import sequence_parallel_parameter_names


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int, dist_cfg: dict):
    """This process plays ``rank`` of a ``world_size`` world laid out by ``dist_cfg``
    (fake collectives); back to a world of one after the block."""
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    dist.reset_dist_util()
    torch_dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        dist.setup_dist_util(dist_cfg)
        yield
    finally:
        torch_dist.destroy_process_group()
        dist.reset_dist_util()
        dist.setup_dist_util({})


def close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---- cross entropy ----------------------------------------------------------------------------


def ce_case():
    logits = 3 * randn(6, 7, seed=1)
    target = torch.tensor([0, 6, -100, 3, 2, -100])
    return logits, target


def test_vocab_parallel_cross_entropy_matches_torch_and_leaves_logits_alone():
    logits, target = ce_case()
    before = logits.clone()
    ce = vocab_parallel_cross_entropy(logits, target, -100, None)
    want = F.cross_entropy(before, target, ignore_index=-100, reduction="none")
    close(ce.loss, want)
    close(ce.row_max, before.max(dim=-1).values)
    close(ce.log_normalizer, before.logsumexp(dim=-1))
    close(ce.exp / ce.sum_exp.unsqueeze(-1), before.softmax(dim=-1))
    assert ce.ignored.tolist() == (target == -100).tolist()
    # the default is out of place: the caller's logits are not overwritten
    assert torch.equal(logits, before)


def test_vocab_parallel_cross_entropy_in_place_reuses_the_logits():
    logits, target = ce_case()
    before = logits.clone()
    ce = vocab_parallel_cross_entropy(logits, target, -100, None, in_place=True)
    close(ce.loss, F.cross_entropy(before, target, ignore_index=-100, reduction="none"))
    # the logits' storage now holds exp(logit - row max): no [N, V] temporary was allocated
    assert ce.exp.data_ptr() == logits.data_ptr()
    close(logits, (before - before.max(dim=-1, keepdim=True).values).exp())


def test_loss_honours_a_custom_ignore_index():
    """ignore_index=0 (a real class for torch): class-0 positions leave the sum and the
    count, in the mean and in the per-token losses."""
    logits, _ = ce_case()
    target = torch.tensor([0, 6, 0, 3, 2, 1])
    loss_fn = ParallelCrossEntropyLoss(ignore_index=0)
    close(loss_fn(logits, target), F.cross_entropy(logits, target, ignore_index=0))
    close(
        loss_fn.token_losses(logits, target),
        F.cross_entropy(logits, target, ignore_index=0, reduction="none"),
    )


def test_mean_of_a_single_valid_token_is_its_loss():
    logits, _ = ce_case()
    target = torch.tensor([-100, -100, 4, -100, -100, -100])
    loss = ParallelCrossEntropyLoss()(logits.view(2, 3, 7), target.view(2, 3))
    close(loss, F.cross_entropy(logits[2:3], target[2:3]))


def test_loss_is_the_local_mean_unless_asked_over_data_parallel():
    """Rank 1 of dp=2: without ``over_data_parallel`` the loss is this rank's own token mean
    (no collective on that path, so the fake group cannot change it)."""
    logits, target = ce_case()
    with fake_rank(1, 2, {}):
        assert dist.get_dist_util().layout.data_parallel_size == 2
        loss = ParallelCrossEntropyLoss()(logits, target)
    close(loss, F.cross_entropy(logits, target, ignore_index=-100))


# ---- Linear -----------------------------------------------------------------------------------


def test_linear_has_a_bias_by_default_like_nn_linear():
    torch.manual_seed(0)
    ref = nn.Linear(4, 3)
    layer = Linear(4, 3)
    assert set(dict(layer.named_parameters())) == set(dict(ref.named_parameters()))
    layer.load_state_dict(ref.state_dict())
    x = randn(2, 5, 4, seed=2)
    close(layer(x), ref(x))


@pytest.mark.parametrize("parallel", ["col", "row"])
def test_sequence_parallel_linear_on_one_process_is_f_linear(parallel):
    """tp=1: the sequence all-gather (col) and reduce-scatter (row) are identities."""
    layer = Linear(4, 6, parallel=parallel, sequence_parallel=True)
    with torch.no_grad():
        layer.bias.copy_(randn(6, seed=3))
    x = randn(2, 5, 4, seed=4)
    close(layer(x), F.linear(x, layer.weight.detach(), layer.bias.detach()))


def test_only_a_sequence_parallel_row_bias_is_marked_for_the_tp_grad_all_reduce():
    row = Linear(4, 6, parallel="row", sequence_parallel=True)
    assert sequence_parallel_parameter_names(row) == {"bias"}
    assert sequence_parallel_parameter_names(Linear(4, 6, parallel="row")) == set()
    col = Linear(4, 6, parallel="col", sequence_parallel=True)  # its bias is split, not summed
    assert sequence_parallel_parameter_names(col) == set()


def test_linear_repr_lists_its_layout():
    layer = Linear(4, 6, parallel="col", layer_idx=2, sequence_parallel=True)
    assert repr(layer) == (
        "Linear(in_features=4, out_features=6, bias=True, parallel=col, layer_idx=2, "
        "sequence_parallel=True)"
    )
    assert repr(Linear(3, 5, bias=False)) == (
        "Linear(in_features=3, out_features=5, bias=False, parallel=data, layer_idx=0)"
    )


def test_tp2_col_linear_splits_out_features_and_row_linear_in_features():
    """Rank 1 of tp=2: a col layer needs only out_features divisible by tp (its weight and
    bias hold rows 2:4 of nn.Linear's), a row layer only in_features."""
    torch.manual_seed(0)
    ref = nn.Linear(3, 4)
    with fake_rank(1, 2, {"tensor_parallel_size": 2}):
        col = Linear(3, 4, parallel="col")
        assert tuple(col.weight.to_local().shape) == (2, 3)
        assert isinstance(col.bias, DTensor) and col.bias.placements == (Shard(0),)
        with torch.no_grad():
            col.weight.to_local().copy_(ref.weight[2:])
            col.bias.to_local().copy_(ref.bias[2:])
        x = randn(2, 3, seed=5)
        close(col(x), ref(x)[:, 2:])  # copy_to_tp forward: no communication
        row = Linear(4, 3, parallel="row")  # out_features=3 need not split
        assert tuple(row.weight.to_local().shape) == (3, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 5, True, "col"), "col-parallel Linear: out_features=5 is not divisible by"),
        ((5, 4, True, "row"), "row-parallel Linear: in_features=5 is not divisible by"),
    ],
)
def test_tp2_linear_refuses_an_odd_split_dim(args, message):
    with fake_rank(0, 2, {"tensor_parallel_size": 2}):
        with pytest.raises(ValueError, match=message + " tensor_parallel_size=2"):
            Linear(*args)


def test_tp2_row_linear_given_an_input_of_neither_size_says_so():
    """(The whole input, 8, is split as OneFlow's boxing does: tests/distributed.)"""
    with fake_rank(0, 2, {"tensor_parallel_size": 2}):
        row = Linear(8, 3, parallel="row")
        with pytest.raises(ValueError) as other_input:
            row(randn(2, 6))
    assert "got 6;" in str(other_input.value)
    assert "this rank's share of in_features, 4 (= 8 / tp 2)" in str(other_input.value)


# ---- LM head ----------------------------------------------------------------------------------


def test_tp2_head_input_is_not_gathered_without_sequence_parallel():
    h = randn(2, 4, 8, seed=6)
    with fake_rank(1, 2, {"tensor_parallel_size": 2}):
        emb = VocabEmbedding(99, 8)
        head = LMLogits(emb)
        # identity forward (all-reduce of d h backward)
        assert torch.equal(enter_head(h, head.tp_group), h)
        assert torch.equal(head.enter(h), h)
        logits = head(h)
    assert logits.shape == (2, 4, 50)  # this rank's vocab shard of every position


@pytest.mark.parametrize(
    ("vocab", "tp", "real_columns"),
    [(99, 2, [50, 49]), (5, 4, [2, 2, 1, 0])],
    ids=["99-on-tp2", "5-on-tp4"],
)
def test_local_vocab_columns_are_the_columns_forward_leaves_unmasked(vocab, tp, real_columns):
    """Each rank's count of real vocab columns: the forward masks the others (vocab
    padding) to the dtype minimum; the hand-computed counts are min(per rank, what is left)."""
    h = randn(1, 3, 8, seed=7)
    got, unmasked = [], []
    for rank in range(tp):
        with fake_rank(rank, tp, {"tensor_parallel_size": tp}):
            head = LMLogits(VocabEmbedding(vocab, 8))
            logits = head(h)
            got.append(head.local_vocab_columns())
            unmasked.append(int((logits[0, 0] != torch.finfo(logits.dtype).min).sum()))
    assert got == unmasked == real_columns


def test_head_on_the_last_stage_owns_a_copy_tied_to_the_embedding():
    """pp=2 x tp=2, rank 3 (last stage, tp rank 1): the embedding lives on stage 0 (meta
    here); the head's copy starts as the embedding a one-process build draws from the same
    seed (this rank's rows 50:100 of the table padded from 99 to 100), and checkpoints map
    the copy to the embedding's entry."""
    torch.manual_seed(0)
    whole = VocabEmbedding(99, 8).weight.detach()
    cfg = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "pipeline_num_layers": 2}
    with fake_rank(3, 4, cfg):
        model = nn.Module()
        torch.manual_seed(0)
        model.emb = VocabEmbedding(99, 8, layer_idx=0)
        model.lm = LMLogits(model.emb, layer_idx=-1)
        assert model.emb.weight.is_meta and model.lm.weight is not None
        local = model.lm.weight.to_local().detach()
        mapping = tied_weights(model)
    close(local, torch.cat([whole[50:], torch.zeros(1, 8)]))
    assert mapping == {"lm.weight": "emb.weight"}
