"""The pipeline contract on every supported torch: which micro-batch counts each schedule
runs (refused up front otherwise, naming the setting), and that only floating-point
activations cross a stage boundary (masks and ids are read by every stage from its batch).

The numbers (pp2 equal to one process for models with padding masks, with an evaluation
before the first training step) are in tests/unit/models/test_hf_*.py through
``hf_parity.run_case``."""

from __future__ import annotations

import pytest
import torch
from launch import torchrun

from libai import dist
from libai.runtime.pipeline_stages import check_schedule_microbatches, check_stage_outputs


def _torch_accepts(schedule: str, n: int, pp: int) -> bool:
    """The rule torch's schedule constructors apply (written out from their docs)."""
    if schedule == "1F1B":
        return n >= pp
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        return n % max(1, n // pp) == 0
    return True  # GPipe, LoopedBFS


@pytest.mark.parametrize(
    "schedule", ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS"]
)
def test_each_schedule_accepts_exactly_the_counts_it_runs(schedule):
    for pp in (2, 3, 4):
        for n in range(1, 13):
            if _torch_accepts(schedule, n, pp):
                check_schedule_microbatches(schedule, n, pp)
            else:
                with pytest.raises(ValueError, match=r"train\.num_accumulation_steps") as exc:
                    check_schedule_microbatches(schedule, n, pp)
                assert schedule in str(exc.value) and "\n" not in str(exc.value)


def test_one_f_one_b_with_fewer_micro_batches_than_stages_names_the_fix():
    with pytest.raises(ValueError) as exc:
        check_schedule_microbatches("1F1B", 1, 2)
    assert str(exc.value) == (
        "pipeline schedule 1F1B needs at least one micro-batch per stage: got 1 "
        "micro-batch(es) for 2 stages; set train.num_accumulation_steps (the pipeline's "
        "micro-batches per step) accordingly, or train.dist.pipeline_schedule='GPipe', which "
        "runs any count"
    )


def test_only_floating_point_activations_cross_a_stage():
    hidden = torch.zeros(2, 3, 4)
    check_stage_outputs("M", hidden)
    check_stage_outputs("M", (hidden, hidden.half(), hidden.to(torch.bfloat16)))
    for bad in (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)):
        with pytest.raises(TypeError, match=r"M\.pipeline_forward .* pipeline_stage_kwargs"):
            check_stage_outputs("M", (hidden, bad))


def test_pp2_refuses_a_micro_batch_count_on_every_rank_before_building_stages():
    """...and lets a last stage return an integer tensor (it hands nothing on): its loss is
    one process's loss of the same model on the same batch, and its predictions of a smaller
    batch are both tensors of the pair, cut back to the real rows."""
    from gpt_reference import SEED, TINY_GPT, make_batch

    from libai.models import GPTForPreTraining

    results = torchrun("pipeline_contract.py", 2, "microbatches")
    errors = [r["error"] for r in results]
    assert all(r["ok"] for r in results), results
    assert errors[0] == errors[1] and errors[0] is not None
    assert "1F1B needs at least one micro-batch per stage" in errors[0]
    torch.manual_seed(SEED)
    no_dropout = dict(embedding_dropout_prob=0.0, attention_dropout_prob=0.0)
    reference = GPTForPreTraining(**TINY_GPT, **no_dropout, output_dropout_prob=0.0)
    dist.setup_dist_util({})
    try:
        want = float(reference(**make_batch(0))["lm_loss"])
        reference.eval()
        logits = reference(make_batch(0)["input_ids"][:3])["logits"]
    finally:
        dist.reset_dist_util()
    for result in results:
        assert result["int_ending_loss"] == pytest.approx(want, rel=1e-5)
    # predictions of 3 rows (padded to the batch of 8 inside): the last stage's pair, cut back
    assert results[0]["predicted"] is None
    predicted = results[1]["predicted"]
    assert predicted["shapes"] == [list(logits.shape), [3, logits.shape[1]]]
    assert predicted["logits_sum"] == pytest.approx(float(logits.sum()), rel=1e-4, abs=1e-3)


def test_pp2_refuses_an_integer_tensor_handed_to_the_next_stage():
    # the first stage refuses; the second, waiting for its input, then fails or is stopped
    try:
        message = torchrun("pipeline_contract.py", 2, "int_output", timeout=300)[0]["error"]
    except AssertionError as exc:  # the second rank was stopped before writing its result
        message = str(exc)
    assert "TypeError: IntHandingGPT.pipeline_forward hands the next" in message
    assert "torch.int64 tensor (output 1)" in message
    assert "pipeline_stage_kwargs(batch)" in message
