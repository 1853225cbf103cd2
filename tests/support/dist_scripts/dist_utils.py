"""The placement vocabulary and fail-fast errors on a real 2-process launch."""

from __future__ import annotations

import logging

import torch
from common import parse_out_dir, run_checks
from omegaconf import OmegaConf
from torch.distributed.tensor import DTensor

from libai import dist
from libai.layers import MultiheadAttention, VocabEmbedding
from libai.models import GPTForPreTraining
from libai.runtime.parallel import ModelRunner

GPT = dict(
    hidden_layers=2, vocab_size=64, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2
)


def error_of(fn) -> str:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return ""


def checks() -> dict:
    out = {}
    # sizes that do not fit the launch fail before any collective, on every rank alike
    out["tp4_on_2"] = error_of(lambda: dist.setup_dist_util({"tensor_parallel_size": 4}))
    out["dp1_on_2"] = error_of(lambda: dist.setup_dist_util({"data_parallel_size": 1}))

    dist.setup_dist_util({"tensor_parallel_size": 2})
    out["tp_sbp"] = [repr(p) for p in dist.get_nd_sbp([dist.split(0), dist.broadcast])]
    out["tp_hidden_sbp"] = [repr(p) for p in dist.get_hidden_sbp()]
    out["tp_mesh_dims"] = list(dist.get_layer_placement(0).mesh_dim_names)
    out["tp_rank"] = dist.get_tensor_parallel_rank()
    out["hidden_error"] = error_of(
        lambda: GPTForPreTraining(**{**GPT, "hidden_size": 33, "num_attention_heads": 3})
    )
    out["heads_error"] = error_of(
        lambda: GPTForPreTraining(**{**GPT, "hidden_size": 24, "num_attention_heads": 3})
    )
    out["kv_heads_error"] = error_of(lambda: MultiheadAttention(16, 4, num_key_value_heads=1))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("libai.layers.embedding").addHandler(handler)
    logging.getLogger("libai.layers.embedding").setLevel(logging.INFO)
    emb = VocabEmbedding(99, 8)
    out["padded_vocab"] = emb.padded_num_embeddings
    out["local_rows"] = emb.weight.to_local().shape[0]
    out["padding_logged"] = any("padded to 100" in r.getMessage() for r in records)
    full = dist.ttol(emb.weight)
    out["ttol_shape"] = list(full.shape)
    out["ttol_rank0"] = dist.ttol(emb.weight, ranks=[0]) is not None
    out["tton_shape"] = list(dist.tton(emb.weight).shape)
    out["broadcast"] = dist.broadcast_py_object({"from": dist.get_rank()}, src=1)
    out["broadcast_default_src"] = dist.broadcast_py_object({"from": dist.get_rank()})
    dist.synchronize()

    dist.setup_dist_util({"data_parallel_size": 2})
    out["dp_hidden_sbp"] = [repr(p) for p in dist.get_hidden_sbp()]
    out["dp_rank"] = dist.get_data_parallel_rank()
    w = GPTForPreTraining(**GPT).GPT_model.embeddings.token_embeddings.weight
    out["dp_param_placements"] = [repr(p) for p in w.placements] if isinstance(w, DTensor) else []

    cfg = OmegaConf.create(
        {"pipeline_parallel_size": 2, "pipeline_num_layers": 2, "custom_pipeline_stage_id": None}
    )
    dist.setup_dist_util(cfg)
    out["recorded_stage_ids"] = list(cfg.custom_pipeline_stage_id)
    out["recorded_dp"] = cfg.data_parallel_size
    out["pp_rank"] = dist.get_pipeline_parallel_rank()
    out["last_stage"] = dist.get_dist_util().get_layer_stage(-1)
    out["placement_other_stage"] = error_of(lambda: dist.get_layer_placement(1 - out["pp_rank"]))
    out["pp_layers_error"] = error_of(lambda: GPTForPreTraining(**{**GPT, "hidden_layers": 3}))
    model = GPTForPreTraining(**GPT)
    out["bad_schedule"] = error_of(lambda: ModelRunner(model, schedule="Zigzag"))
    out["interleaved_needs_vpp"] = error_of(lambda: ModelRunner(model, schedule="Interleaved1F1B"))
    out["main"], out["last"] = dist.is_main_process(), dist.is_last_process()
    assert torch.is_tensor(full)
    return out


if __name__ == "__main__":
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, checks)
