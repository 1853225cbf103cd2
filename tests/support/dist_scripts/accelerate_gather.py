"""``AccelerateEngine.gather`` on two data-parallel ranks: each rank's tensor, concatenated
along dim 0 in rank order, on every rank."""

from __future__ import annotations

from common import parse_out_dir, run_checks


def checks(out_dir) -> dict:
    import torch

    from libai.accelerate.engine import AccelerateEngine

    engine = AccelerateEngine({"save": str(out_dir / "save")})
    rank = engine.util.data_parallel_rank
    mine = torch.arange(6).reshape(3, 2) + 10 * rank
    return {
        "dp": engine.util.layout.data_parallel_size,
        "dp_rank": rank,
        "gathered": engine.gather(mine.t()).tolist(),  # non-contiguous in
    }


if __name__ == "__main__":
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, lambda: checks(out_dir))
