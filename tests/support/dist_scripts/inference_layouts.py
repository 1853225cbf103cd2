"""Inference pipelines on every layout of this world size (arg: the spec JSON written by
``test_inference_pipelines.dist_case``): rank 0 must return the single-process results,
every other rank ``None``."""

from __future__ import annotations

import json
import os

from common import parse_out_dir, run_checks
from inference_helpers import BERT_MASKED, ROBERTA_MASKED, TEXTS, assert_same_results

from libai import dist
from libai.inference import (
    FillMaskPipeline,
    ImageClassificationPipeline,
    TextClassificationPipeline,
)

out_dir, _, (spec_path,) = parse_out_dir()
spec = json.loads(open(spec_path).read())

LAYOUTS = {
    2: {
        "dp2": dict(data_parallel=2),
        "tp2": dict(tensor_parallel=2),
        "pp2": dict(pipeline_parallel=2),
        "pp2_custom": dict(pipeline_parallel=2, pipeline_stage_id=[0, 1, 1]),
    },
    4: {
        "tp2_pp2": dict(tensor_parallel=2, pipeline_parallel=2),
        "dp2_tp2": dict(data_parallel=2, tensor_parallel=2),
    },
}


def outcome(result, want) -> str:
    if dist.get_rank() != 0:
        return "None" if result is None else f"got {str(result)[:200]}"
    try:
        assert_same_results(result, json.loads(json.dumps(want)), tol=1e-5)
    except AssertionError as exc:
        return f"differs: {str(exc)[:500]}"
    return "equal"


def stage_params(model) -> dict:
    """This rank's encoder layers, whether it holds the embeddings / heads, and the local
    rows of its fused qkv weights (halved under tp2)."""
    params = dict(model.named_parameters())
    names = list(params)
    qkv = next(p for n, p in params.items() if n.endswith("query_key_value.weight"))
    local = qkv.to_local() if hasattr(qkv, "to_local") else qkv
    return {
        "qkv_rows": list(local.shape)[0],
        "encoders": sorted({n.split(".")[2] for n in names if ".encoders." in n}),
        "embeddings": any(".embeddings." in n for n in names),
        "heads": any(n.startswith("cls_head.") for n in names),
    }


def checks() -> dict:
    want = spec["expected"]
    layouts, stages = {}, {}
    for name, layout in LAYOUTS[int(os.environ["WORLD_SIZE"])].items():
        hf = dict(mode="huggingface", **layout)
        fill = FillMaskPipeline(model_path=spec["bert"], **hf)
        stages[name] = stage_params(fill.model)
        results = {"fill_mask": outcome(fill(BERT_MASKED, top_k=3), want["fill_mask"])}
        # one input: under dp2 the first replica gets none and still answers
        results["single"] = outcome(fill(BERT_MASKED[0], top_k=3), want["fill_mask"][0])
        classify = TextClassificationPipeline(model_path=spec["bert_cls"], **hf)
        results["classify"] = outcome(classify(TEXTS, top_k=None), want["classify"])
        libai = FillMaskPipeline(spec["config"], model_path=spec["checkpoint"], **layout)
        results["libai"] = outcome(libai(BERT_MASKED), want["libai"])
        if "custom" not in name:  # 2-layer models
            roberta = FillMaskPipeline(model_path=spec["roberta"], **hf)
            results["roberta"] = outcome(roberta(ROBERTA_MASKED), want["roberta"])
            image = ImageClassificationPipeline(model_path=spec["vit"], **hf)
            results["image"] = outcome(image(spec["images"]), want["image"])
        layouts[name] = results
    return {"layouts": layouts, "stage_params": stages}


run_checks(out_dir, checks)
