"""Parity of a libai model loaded with ``load_huggingface`` against the transformers model.

A test builds a tiny random transformers model, saves it, computes the reference (outputs,
loss and every gradient, by Hugging Face name) and calls :func:`check_parity` for each layout:
1 process in-process, others under torchrun through ``dist_scripts/hf_layouts.py``. On every
layout the libai model is loaded from the directory, its outputs (without pp), loss and every
gradient (mapped back to Hugging Face names by the loader's own rules) are compared, and it is
exported with ``save_huggingface`` for the test to reload with transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

TOL = 1e-4


def hf_reference(hf_model, hf_inputs: dict, loss_fn, outputs: dict) -> dict:
    """Run ``hf_model`` in train mode (dropout must be 0): ``outputs`` maps a libai output key
    to ``fn(hf_output) -> tensor``; ``loss_fn(hf_output)`` is the loss whose gradients are
    compared. Returns ``{"outputs", "loss", "grads"}``."""
    hf_model.train()
    hf_model.zero_grad(set_to_none=True)
    out = hf_model(**hf_inputs)
    loss = loss_fn(out)
    loss.backward()
    return {
        "outputs": {k: fn(out).detach() for k, fn in outputs.items()},
        "loss": loss.detach(),
        "grads": {
            n: p.grad.detach().clone() for n, p in hf_model.named_parameters() if p.grad is not None
        },
    }


def checkpoint_named(hf_model, tensors: dict, path) -> dict:
    """``tensors`` (keyed by ``hf_model``'s parameter names) under the names a checkpoint
    stores: transformers 5 renames some models' modules at run time (ViT's and Swin's
    ``q_proj``, ``fc1``, ...) but saves the classic names the loaders read, so save the
    tensors as weights and read them back."""
    import copy

    from safetensors.torch import load_file

    clone = copy.deepcopy(hf_model)
    with torch.no_grad():
        for name, p in clone.named_parameters():
            p.copy_(tensors[name])
    clone.save_pretrained(path)
    return load_file(str(Path(path) / "model.safetensors"))


def save_case(path: Path, *, batch: dict, input_keys: list[str], ref: dict) -> str:
    """``batch``: the libai training batch (with labels); ``input_keys``: the keys of the
    label-free forward whose dict outputs are compared with ``ref["outputs"]``."""
    torch.save({"batch": batch, "input_keys": input_keys, "ref": ref}, path)
    return str(path)


def _grad_diffs(model, ref_grads: dict, loader) -> tuple[float, str, int]:
    """Max |libai grad - HF grad| over the parameters this rank holds, by HF name."""
    from libai.models.utils.hf_export import model_libai_cfg
    from libai.models.utils.model_loader.base_loader import complete_rules
    from libai.models.utils.model_loader.libai_protocol import prefixed_name

    rules = complete_rules(model, loader.rules(model_libai_cfg(model), type(model)))
    worst, worst_name, checked = 0.0, "", 0
    for name, p in model.named_parameters():
        if getattr(p, "libai_tied_copy", False) or not p.requires_grad:
            continue  # (no gradient: e.g. DeepSeek's expert bias, moved outside backward)
        if p.grad is None:
            raise AssertionError(f"{name} has no gradient")
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        logical = getattr(p, "libai_logical_shape", None)
        if logical is not None:
            g = g[tuple(slice(0, s) for s in logical)]
        for hf_name, value in rules[name].export(g).items():
            real = prefixed_name(hf_name, ref_grads, loader.base_model_prefix)
            if real is None:
                raise AssertionError(f"no reference gradient for {hf_name} ({name})")
            diff = (value - ref_grads[real]).abs().max().item()
            checked += 1
            if diff > worst:
                worst, worst_name = diff, hf_name
    return worst, worst_name, checked


def run_case(case_path: str, hf_dir: str, spec: dict) -> dict:
    """On the current mesh (set up by the caller): load, compare, export. Returns diffs.

    ``spec``: ``model`` (dotted libai class path or None), ``overrides`` (libai kwargs),
    ``microbatches``, ``export_dir`` (optional), ``max_shard_size``.
    """
    import importlib

    from libai import dist
    from libai.models.utils import (
        get_loader_class,
        load_huggingface,
        read_hf_config,
        save_huggingface,
    )
    from libai.runtime.parallel import ModelRunner

    case = torch.load(case_path, weights_only=False)
    model_cls = None
    if spec.get("model"):
        module, name = spec["model"].rsplit(".", 1)
        model_cls = getattr(importlib.import_module(module), name)
    model = load_huggingface(hf_dir, model_cls, **spec.get("overrides", {}))
    loader = get_loader_class(read_hf_config(hf_dir)["model_type"])
    util = dist.get_dist_util()
    dp, dpr = util.layout.data_parallel_size, util.data_parallel_rank
    batch = {k: v.chunk(dp)[dpr] for k, v in case["batch"].items()}
    result = {}
    ref = case["ref"]
    if util.layout.pipeline_parallel_size == 1 and ref["outputs"]:
        model.eval()
        with torch.no_grad():
            out = model(**{k: batch[k] for k in case["input_keys"]})
        for key, want in ref["outputs"].items():
            result[f"out_{key}"] = (out[key] - want.chunk(dp)[dpr]).abs().max().item()
        model.train()
    runner = ModelRunner(model, num_microbatches=spec.get("microbatches", 1))
    handed = []  # what a stage sends the next one: activations only, no masks or ids
    if util.layout.pipeline_parallel_size > 1:
        # the first schedule call is an evaluation (as a trainer evaluating before it
        # trains): the stages are built then, and the training step after it must still
        # send gradients back (torch 2.10 / 2.11 fix that when the stages are built)
        eval_loss = runner.eval_loss(batch)  # this dp rank's: compared without dp only
        if dp == 1:
            result["eval_loss"] = abs(eval_loss.item() - ref["loss"].item())
        for stage in runner.stage_schedule.stages:
            if not stage.is_last:
                stage.submod.register_forward_hook(
                    lambda m, a, out: handed.extend(out if isinstance(out, tuple) else (out,))
                )
    loss = runner.forward_backward(batch)
    result["loss"] = abs(loss.item() - ref["loss"].item())
    if util.layout.pipeline_parallel_size > 1 and util.pipeline_rank == 0:
        result["handed_non_float"] = sum(not t.is_floating_point() for t in handed)
        assert handed, "the first stage handed nothing on"
    result["sharded"] = {  # the parameters this rank holds a tensor-parallel shard of
        n: [list(p.to_local().shape), list(p.shape)]
        for n, p in model.named_parameters()
        if isinstance(p, DTensor) and p.to_local().shape != p.shape
    }
    result["grad"], result["grad_name"], result["grads_checked"] = _grad_diffs(
        model, ref["grads"], loader
    )
    if spec.get("export_dir"):
        save_huggingface(
            model, spec["export_dir"], max_shard_size=spec.get("max_shard_size", 2**30)
        )
    return result


def assert_close(result: dict, tol: float = TOL) -> None:
    """Every difference in a :func:`run_case` result is below ``tol``."""
    assert result["grads_checked"] > 0, result
    for key, value in result.items():
        if key in ("grad_name", "grads_checked", "sharded"):
            continue
        assert value < tol, f"{key} differs by {value:.3g} ({result})"


def check_single_process(case_path: str, hf_dir: str, spec: dict) -> dict:
    """:func:`run_case` on one in-process rank."""
    from libai import dist

    dist.setup_dist_util({})
    result = run_case(case_path, hf_dir, spec)
    assert_close(result)
    return result


def check_layouts(case_path: str, hf_dir: str, nproc: int, layouts: list[dict]) -> dict:
    """Run :func:`run_case` under torchrun for each ``{"name", "dist", **spec}`` layout (its
    own ``case`` / ``hf_dir`` keys replace the arguments: several models in one launch);
    returns ``{name: [result of each rank]}`` after asserting every one is close."""
    from launch import torchrun

    results = torchrun("hf_layouts.py", nproc, case_path, hf_dir, json.dumps(layouts))
    by_name: dict[str, list] = {}
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        for name, item in r["layouts"].items():
            by_name.setdefault(name, []).append(item)
    for name, items in by_name.items():
        for rank, item in enumerate(items):
            try:
                assert_close(item)
            except AssertionError as exc:
                raise AssertionError(f"layout {name}, rank {rank}: {exc}") from None
    return by_name


def tp2_layout(root: Path) -> dict:
    """tp2, exported to ``root / "tp2"``."""
    return {"name": "tp2", "dist": {"tensor_parallel_size": 2}, "export_dir": str(root / "tp2")}


def pp2_layout(root: Path, max_shard_size: int | None = 20_000) -> dict:
    """pp2 over 2 layers with 2 microbatches, exported (sharded) to ``root / "pp2"``."""
    layout = {
        "name": "pp2",
        "dist": {"pipeline_parallel_size": 2, "pipeline_num_layers": 2},
        "microbatches": 2,
        "export_dir": str(root / "pp2"),
    }
    if max_shard_size is not None:
        layout["max_shard_size"] = max_shard_size
    return layout


def dp2_tp2_layout(root: Path) -> dict:
    """dp2 x tp2, exported to ``root / "dp2tp2"``."""
    return {
        "name": "dp2xtp2",
        "dist": {"data_parallel_size": 2, "tensor_parallel_size": 2},
        "export_dir": str(root / "dp2tp2"),
    }


#: config.json entries an export may write differently: bookkeeping, not the model
CONFIG_BOOKKEEPING = {
    "_name_or_path",
    "transformers_version",
    "architectures",
    "dtype",
    "torch_dtype",
}


def assert_same_config(path, source) -> None:
    """Every setting of ``source``'s config (with transformers' defaults filled in) has the
    same value in the config exported to ``path``: an export that writes a default instead
    of the model's value (an epsilon, the RoPE base, T5's buckets) fails here."""
    import transformers

    want = transformers.AutoConfig.from_pretrained(source).to_dict()
    got = transformers.AutoConfig.from_pretrained(path).to_dict()
    if want.get("model_type") == "gpt2" and want.get("n_inner") is None:
        want["n_inner"] = 4 * want["n_embd"]  # None means 4 x n_embd: the export says so
    differ = {
        k: (got.get(k, "<missing>"), v)
        for k, v in want.items()
        if k not in CONFIG_BOOKKEEPING and got.get(k, "<missing>") != v
    }
    assert not differ, f"exported config differs from the source (got, want): {differ}"


def assert_exported(path, hf_cls, want: dict, source=None) -> None:
    """The checkpoint exported to ``path`` reloads with ``hf_cls`` to exactly ``want``;
    with ``source`` (the loaded directory), its config equals the source's too."""
    got = hf_cls.from_pretrained(path).state_dict()
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    if source is not None:
        assert_same_config(path, source)


def edit_config(directory, drop=(), **update) -> None:
    """Rewrite ``directory/config.json`` without the keys ``drop`` and with ``update`` (a
    checkpoint whose config lacks a key, to compare with transformers' default for it)."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    for key in drop:
        config.pop(key, None)
    config.update(update)
    path.write_text(json.dumps(config))
    assert not set(drop) & set(json.loads(path.read_text()))
