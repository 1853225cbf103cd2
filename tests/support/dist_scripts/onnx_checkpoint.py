"""A tp2-trained checkpoint for the ONNX export test (run by
tests/unit/onnx_export/test_onnx_export.py).

Builds the GPT-2 of ``configs/gpt2_pretrain.py`` (tiny overrides given on the command line)
on a tp2 mesh, takes one SGD step, saves a DCP checkpoint with the trainer's Checkpointer
into ``CKPT_DIR`` and writes the eval-mode logits of a fixed left-padded batch to
``CKPT_DIR/reference.pt`` (rank 0). Every rank reports its local embedding shard shape.

Usage: onnx_checkpoint.py --out DIR CKPT_DIR override [override ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common import parse_out_dir, run_checks

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.config import LazyConfig, instantiate
from libai.layers import local_value
from libai.runtime.parallel import ModelRunner

ROOT = Path(__file__).resolve().parents[3]  # tests/support/dist_scripts/ -> the checkout


def reference_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed ``(input_ids, attention_mask, position_ids)``: 2 rows of 6, row 0 left-padded."""
    ids = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def main() -> None:
    out_dir, _, rest = parse_out_dir()
    ckpt_dir, overrides = rest[0], rest[1:]

    def checks() -> dict:
        cfg = LazyConfig.load(str(ROOT / "configs" / "gpt2_pretrain.py"))
        cfg = LazyConfig.apply_overrides(cfg, overrides)
        dist.setup_dist_util({"tensor_parallel_size": 2})
        torch.manual_seed(0)
        model = instantiate(cfg.model)
        vocab = cfg.model.cfg.vocab_size
        tokens = torch.randint(0, vocab, (4, 9), generator=torch.Generator().manual_seed(1))
        batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        loss = ModelRunner(model).forward_backward(batch)
        optimizer.step()
        model.eval()
        ids, mask, positions = reference_batch(vocab)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, position_ids=positions)["logits"]
        Checkpointer(model, ckpt_dir).save("model_final", iteration=1)
        if dist.get_rank() == 0:
            ref = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
            torch.save({**ref, "logits": logits}, Path(ckpt_dir) / "reference.pt")
        shard = local_value(model.GPT_model.embeddings.token_embeddings.weight)
        return {"loss": float(loss), "embedding_shard": list(shard.shape)}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    sys.exit(main())
