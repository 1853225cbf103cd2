"""The pipeline contract's refusals on 2 ranks (pp2), run by
tests/unit/runtime/test_pipeline_stages.py.

``microbatches``: 1F1B with one micro-batch for two stages is refused by ``ModelRunner`` on
every rank alike, before a stage is built. ``int_output``: a model handing the next stage
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


def checks(case: str) -> dict:
    dist.setup_dist_util(dict(PP, pipeline_schedule="1F1B"))
    if case == "microbatches":
        try:
            ModelRunner(build_model(), num_microbatches=1)
        except ValueError as exc:
            return {"error": str(exc)}
        return {"error": None}
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
