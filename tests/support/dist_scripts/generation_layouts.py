"""Text generation on tensor / pipeline / data-parallel layouts of 4 ranks (arg: the spec
JSON of ``test_generation.test_parallel_generation_equals_one_process``): rank 0 must return
exactly the single-process texts; every rank reports what its stage holds (the layers in its
KV cache, their kv heads, its parameter count)."""

from __future__ import annotations

import json

import torch.distributed as torch_dist
from common import parse_out_dir, run_checks

from libai.inference.text_generation import TextGenerationPipeline

out_dir, _, (spec_path,) = parse_out_dir()
spec = json.loads(open(spec_path).read())


def held(pipe) -> dict:
    """This rank's share: cached layer ids, kv heads per cached layer, parameters."""
    cache = pipe.stepper.cache
    layers = sorted(cache.layers)
    heads = sorted({c.get()[0].shape[1] for c in cache.layers.values() if c.get() is not None})
    params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                 for p in pipe.model.parameters())  # fmt: skip
    return {"layers": layers, "kv_heads": heads, "params": params}


def checks() -> dict:
    report = {}
    for layout_name, layout in spec["layouts"].items():
        for kind, path in spec["dirs"].items():
            stage_ids = layout.get("pipeline_stage_id", {}).get(kind)
            kwargs = {k: v for k, v in layout.items() if k != "pipeline_stage_id"}
            pipe = TextGenerationPipeline(
                model_path=path, mode="huggingface", pipeline_stage_id=stage_ids, **kwargs
            )
            for case_name, call in spec["calls"].items():
                got = pipe(spec["prompts"], **call)
                key = f"{layout_name}/{kind}/{case_name}"
                want = spec["expected"][f"{kind}/{case_name}"]
                if torch_dist.get_rank() == 0:
                    report[key] = "ok" if got == want else f"got {got}, want {want}"
                else:
                    report[key] = "ok" if got is None else f"rank returned {got}"
            report[f"{layout_name}/{kind}/held"] = held(pipe)
    return report


run_checks(out_dir, checks)
