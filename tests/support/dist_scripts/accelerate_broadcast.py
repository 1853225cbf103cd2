"""Megatron's ``mpu.broadcast_data`` (``libai.accelerate.mpu``) on a tp=2 mesh: tensor-parallel
rank 0 holds the batch, rank 1 passes ``None``; both get rank 0's tensors, of ``datatype``."""

from __future__ import annotations

from common import parse_out_dir, run_checks

from libai import dist


def checks() -> dict:
    import torch

    from libai.accelerate import mpu

    dist.setup_dist_util({"tensor_parallel_size": 2})
    assert mpu.get_tensor_model_parallel_world_size() == 2
    rank = mpu.get_tensor_model_parallel_rank()
    data = None
    if rank == 0:
        g = torch.Generator().manual_seed(7)
        data = {
            "input_ids": torch.randint(0, 100, (3, 5), generator=g),
            "next_sentence_label": torch.tensor([1, 0, 1]),
            "weights": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),  # float: cast to int64
        }
    out = mpu.broadcast_data(["input_ids", "next_sentence_label", "weights"], data, torch.int64)
    # a dimension past float32's exact integers (2**24): the shapes travel as int64
    long = (torch.arange(2**24 + 3, dtype=torch.int32) % 251).to(torch.uint8)
    big = mpu.broadcast_data(["bytes"], {"bytes": long} if rank == 0 else None, torch.uint8)
    return {
        "long_shape": list(big["bytes"].shape),
        "long_equal": bool(torch.equal(big["bytes"], long)),
        "tp_rank": rank,
        "values": {k: v.tolist() for k, v in out.items()},
        "dtypes": sorted({str(v.dtype) for v in out.values()}),
    }


if __name__ == "__main__":
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, checks)
