"""``torch._dynamo.explain`` of the tiny GPT on tp2: the tensor-parallel collectives of the
blocks and the model trace into one graph (no graph break)."""

from __future__ import annotations

import torch
from common import parse_out_dir, run_checks

from libai import dist
from libai.models import GPTForPreTraining


def main():
    out_dir, _, _ = parse_out_dir()

    def checks():
        dist.setup_dist_util({"tensor_parallel_size": 2})
        torch.manual_seed(0)
        gpt = GPTForPreTraining(
            hidden_layers=2,
            vocab_size=64,
            hidden_size=32,
            ffn_hidden_size=64,
            num_attention_heads=4,
            max_seq_length=16,
        )
        ids = torch.randint(0, 64, (2, 8))
        block = torch._dynamo.explain(gpt.GPT_model.transformer.layers["0"])(torch.randn(2, 8, 32))
        model = torch._dynamo.explain(gpt)(ids, ids)
        return {
            "block_breaks": block.graph_break_count,
            "model_breaks": model.graph_break_count,
            "reasons": [str(r.reason) for r in model.break_reasons],
        }

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
