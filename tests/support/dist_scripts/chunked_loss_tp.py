"""The chunked LM loss under tp2 and pp2 against the single-process reference (2 ranks).

For GPT-2 (tied head), Llama (untied) and Llama (tied), one forward-backward through the
trainer's ``ModelRunner`` with ``loss_chunk_size`` set:

- tp2 (the head split over the vocab, padded 99 -> 100): the loss and every gradient equal
  one process's plain loss; this rank's head shard has V/tp rows, and autograd saved no
  ``[tokens, V/tp]`` tensor (the plain loss, run here too, saves some);
- pp2 (1F1B, 2 micro-batches; GPT's tied head a copy on the last stage): the loss and every
  gradient equal one process with chunking on and 2 micro-batches; the last stage holds the
  head and no embedding-stage layers. Evaluation still works: ``eval_loss`` and
  ``predict`` + ``pipeline_loss`` (logits, under no_grad) give the same loss;
- pp2 under bf16 autocast (GPT): equal to one process under bf16 autocast, so the last
  stage's hand-off (hidden states cast as the head reads them) keeps autocast's numerics
  although the schedule computes the loss outside autocast.
"""

from __future__ import annotations

import torch
from chunked_loss_cases import (
    MODELS,
    REL_TOL,
    VOCAB,
    build,
    make_batch,
    run_step,
    worst_relative,
)
from common import parse_out_dir, run_checks
from torch.distributed.tensor import DTensor

from libai import dist
from libai.runtime.parallel import pipeline_target

CHUNK = 7
PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": 2}
#: bf16 runs of the same computation on 1 and 2 processes: only fp32 sums are reordered (the
#: tied-embedding gradient between stages); 2e-7 measured, bf16's own rounding is 4e-3
BF16_REL_TOL = 1e-3


def saved_logit_shaped(model, batch, width: int) -> int:
    """How many tensors autograd saves in ``model(**batch)`` that are ``[tokens, width]``."""
    tokens = batch["labels"].numel()
    found = []

    def pack(t):
        if t.dim() >= 2 and t.shape[-1] == width and t.numel() >= tokens * width:
            found.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch)["lm_loss"].backward()
    return len(found)


def check_tp(name: str, ref: dict) -> dict:
    dist.setup_dist_util({"tensor_parallel_size": 2})
    batch = make_batch()
    model = build(name, CHUNK)
    result = run_step(model, name, batch)
    head = model.GPT_model.lm_head if name == "gpt2" else model.lm_head
    weight = head.tied_weight()  # the word embedding when tied (one stage)
    assert isinstance(weight, DTensor) and weight.to_local().shape[0] == 50, weight.shape
    loss_diff = abs(result["loss"] - ref["loss"]) / abs(ref["loss"])
    grad_rel, where = worst_relative(result["grads"], ref["grads"])
    assert set(result["grads"]) == set(ref["grads"]), sorted(result["grads"])
    assert loss_diff <= REL_TOL and grad_rel <= REL_TOL, (name, loss_diff, grad_rel, where)
    model.zero_grad(set_to_none=True)
    chunked_saved = saved_logit_shaped(model, batch, 50)
    plain = build(name)
    plain_saved = saved_logit_shaped(plain, batch, 50)
    assert chunked_saved == 0 and plain_saved > 0, (chunked_saved, plain_saved)
    return {
        "name": f"tp2-{name}",
        "loss_diff": loss_diff,
        "grad_rel": grad_rel,
        "head_rows": weight.to_local().shape[0],
        "saved_logits": [chunked_saved, plain_saved],
    }


def check_pp(name: str, refs: dict, amp: bool = False) -> dict:
    ref = refs["chunked_mb2"][name]
    util = dist.setup_dist_util(dict(PP))
    batch = make_batch()
    model = build(name, CHUNK)
    amp_dtype = torch.bfloat16 if amp else None
    handed = []  # what the last stage's forward hands to the loss (outside autocast)
    result = run_step(
        model, name, batch, microbatches=2, amp_dtype=amp_dtype, on_stage_output=handed.append
    )
    runner = result["runner"]
    is_last = util.pipeline_rank == 1
    if is_last:  # the hidden states as the head reads them: autocast's dtype, hidden size
        assert {(str(t.dtype), t.shape[-1]) for t in handed} == {
            ("torch.bfloat16" if amp else "torch.float32", 32)
        }, [(t.dtype, t.shape) for t in handed]
    head = model.GPT_model.lm_head if name == "gpt2" else model.lm_head
    assert (head is not None) == is_last
    want = ref["bf16" if amp else "grads"]
    grads = result["grads"]
    assert grads and set(grads) <= set(want), sorted(set(grads) - set(want))
    grad_rel, where = worst_relative(grads, want)
    loss_diff = abs(result["loss"] - ref["loss_bf16" if amp else "loss"]) / abs(ref["loss"])
    tol = BF16_REL_TOL if amp else REL_TOL
    assert loss_diff <= tol and grad_rel <= tol, (name, amp, loss_diff, grad_rel, where)
    out = {
        "name": f"pp2-{name}" + ("-bf16" if amp else ""),
        "loss_diff": loss_diff,
        "grad_rel": grad_rel,
        "grad_names": sorted(grads),
    }
    if not amp:
        # evaluation keeps the logits: eval_loss (the mean over micro-batches) and predict +
        # pipeline_loss (grad enabled, as the trainer's evaluate calls it; the whole batch's
        # logits: one process's plain loss) give the losses of the same weights
        model.eval()
        out["eval_diff"] = abs(float(runner.eval_loss(batch)) - result["loss"])
        logits = runner.predict(batch)
        if is_last:
            assert logits.shape[-1] == VOCAB, logits.shape  # vocab logits, not hidden states
            loss = model.pipeline_loss(logits, pipeline_target(model, batch))
            out["predict_diff"] = abs(float(loss) - refs["plain"][name]["loss"])
        assert out["eval_diff"] <= 1e-5 and out.get("predict_diff", 0.0) <= 1e-5, out
    return out


def main():
    out_dir, _, rest = parse_out_dir()
    ref = torch.load(rest[0])

    def checks():
        cases = [check_tp(name, ref["plain"][name]) for name in MODELS]
        cases += [check_pp(name, ref) for name in MODELS]
        cases.append(check_pp("gpt2", ref, amp=True))
        return {"cases": cases}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
