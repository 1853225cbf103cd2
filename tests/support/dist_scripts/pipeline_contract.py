"""The pipeline contract's refusals on 2 ranks (pp2), run by
tests/unit/runtime/test_pipeline_stages.py.

``microbatches``: 1F1B with one micro-batch for two stages is refused by ``ModelRunner`` on
every rank alike, before a stage is built; then a last stage that returns an integer tensor
next to its logits (it hands nothing on, so nothing refuses it) trains, and its loss is
returned. ``int_output``: a model handing the next stage
an integer tensor is refused on the stage that hands it, naming the fix.
"""

from __future__ import annotations

import torch
from common import parse_out_dir, run_checks
from gpt_reference import SEED, TINY_GPT, build_model, make_batch

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallel import ModelRunner

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": TINY_GPT["hidden_layers"]}


class IntHandingGPT(GPTForPreTraining):
    """Hands the next stage a mask of integers next to the hidden states."""

    def pipeline_forward(self, x, mask=None):
        out = super().pipeline_forward(x)
        if self.GPT_model.lm_head is None:  # not the last stage
            return out, torch.ones(x.shape[:2], dtype=torch.long)
        return out


#: no dropout: the loss of a step is that of one process on the same batch
NO_DROPOUT = dict(embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)


class IntEndingGPT(GPTForPreTraining):
    """The last stage returns a count of integers next to its logits; its loss reads the
    logits."""

    def pipeline_forward(self, x, mask=None):
        out = super().pipeline_forward(x)
        if self.GPT_model.lm_head is None:
            return out
        return out, torch.ones(x.shape[:2], dtype=torch.long)

    def pipeline_loss(self, output, labels):
        return super().pipeline_loss(output[0], labels)


def checks(case: str) -> dict:
    dist.setup_dist_util(dict(PP, pipeline_schedule="1F1B"))
    if case == "microbatches":
        try:
            ModelRunner(build_model(), num_microbatches=1)
        except ValueError as exc:
            error = str(exc)
        else:
            error = None
        torch.manual_seed(SEED)
        runner = ModelRunner(IntEndingGPT(**TINY_GPT, **NO_DROPOUT), num_microbatches=2)
        loss = float(runner.forward_backward(make_batch(0)))
        # 3 rows, padded to the training batch and cut back: the last stage's pair, 3 rows each
        out = runner.predict({k: v[:3] for k, v in make_batch(0).items()})
        if out is not None:
            out = {"shapes": [list(t.shape) for t in out], "logits_sum": float(out[0].sum())}
        return {"error": error, "int_ending_loss": loss, "predicted": out}
    assert case == "int_output", case
    torch.manual_seed(SEED)
    runner = ModelRunner(IntHandingGPT(**TINY_GPT), num_microbatches=2)
    runner.forward_backward(make_batch(0))
    return {"error": None}


def main() -> None:
    out_dir, _, (case,) = parse_out_dir()
    run_checks(out_dir, lambda: checks(case))


if __name__ == "__main__":
    main()
