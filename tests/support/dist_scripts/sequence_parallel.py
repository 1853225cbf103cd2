"""Sequence parallel (``train.dist.sequence_parallel``) against the single-process references.

For every case (a model and a layout): the initial weights, the loss of each of STEPS steps,
every gradient of the first step, the clipping norms and every parameter after STEPS
optimizer steps equal the reference; forward hooks record the activation shapes of the first
forward (the test checks that norms, residuals and stage boundaries hold seq / tp positions);
the names of the parameters whose gradients are summed over tp are reported. With
``"control": true`` one extra step runs without that sum first, to show it matters. With
``"errors": true`` the bad inputs are tried on the sequence-parallel mesh (with
``"pipeline_errors": true`` an odd sequence through the pipeline schedule). ``"model_kwargs"``
go to the model (e.g. ``loss_chunk_size``: the same loss and gradients as the reference's
plain head), ``"runner"`` to the ModelRunner (e.g. activation checkpointing).
"""

from __future__ import annotations

import torch
from common import run_cases
from gpt_reference import (
    MAX_GRAD_NORM,
    STEPS,
    make_optimizer,
    max_diff,
)
from sp_reference import MODELS

from libai import dist
from libai.layers import TransformerLayer
from libai.models import BertForPreTraining
from libai.runtime.parallel import ModelRunner


def _first_tensor(value) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def record_shapes(model) -> tuple[dict, list]:
    """Forward hooks recording, once each, the shapes around every local block and the head:
    ``"<layer>.<what>"`` -> shape. Returns the dict and the hook handles."""
    shapes, handles = {}, []

    def on_input(key):
        def hook(module, args):
            shapes.setdefault(key, list(_first_tensor(args).shape))

        return hook

    def on_output(key):
        def hook(module, args, out):
            shapes.setdefault(key, list(_first_tensor(out).shape))

        return hook

    for layer in (m for m in model.modules() if isinstance(m, TransformerLayer)):
        i = layer.layer_idx
        watched = {
            "block": layer,
            "input_norm": layer.input_layernorm,
            "mlp_norm": layer.post_cross_attention_layernorm,
            "attention": layer.self_attention,
            "mlp": layer.mlp,
            "qkv": layer.self_attention.query_key_value,
            "mlp_up": layer.mlp.dense_h_to_4h,
        }
        for what, module in watched.items():
            handles.append(module.register_forward_pre_hook(on_input(f"{i}.{what}_in")))
            handles.append(module.register_forward_hook(on_output(f"{i}.{what}_out")))
    head = getattr(model, "lm_head", None) or getattr(model.GPT_model, "lm_head", None)
    if head is not None:
        handles.append(head.register_forward_pre_hook(on_input("head_in")))
        handles.append(head.register_forward_hook(on_output("head_out")))
    return shapes, handles


def unsynced_grad_diff(runner, batch, state, ref) -> float:
    """The first step's gradients without the tp sum of the sequence-parallel parameters:
    how far the classic bug lands from the reference (then the gradients are dropped)."""
    names = runner.grads.sequence_parallel_names
    runner.grads.sequence_parallel_names = set()
    runner.forward_backward(batch)
    runner.grads.sequence_parallel_names = names
    grads = state(runner.model, with_grads=True)
    diff, _ = max_diff({k: v for k, v in grads.items() if k in names}, ref["grads"])
    runner.model.zero_grad(set_to_none=True)
    return diff


def check_case(case: dict, refs: dict) -> dict:
    util = dist.setup_dist_util({**case["dist"], "sequence_parallel": True})
    dp = util.layout.data_parallel_size
    build, batch_fn, state = MODELS[case["model"]]
    ref = refs[case["model"]]
    model = build(**case.get("model_kwargs", {}))
    runner = ModelRunner(
        model, num_microbatches=case.get("microbatches", 1), **case.get("runner", {})
    )
    init_diff, init_name = max_diff(state(model), ref["init"])

    def local_batch(step):
        return {k: v.chunk(dp)[util.data_parallel_rank] for k, v in batch_fn(step).items()}

    control = (
        unsynced_grad_diff(runner, local_batch(0), state, ref) if case.get("control") else None
    )
    shapes, handles = record_shapes(model)
    optimizer = make_optimizer(model)
    losses, norms, grad_diff, grad_name = [], [], None, None
    for step in range(STEPS):
        losses.append(float(runner.forward_backward(local_batch(step))))
        if step == 0:
            for handle in handles:
                handle.remove()
            grad_diff, grad_name = max_diff(state(model, with_grads=True), ref["grads"])
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    final_diff, final_name = max_diff(state(model), ref["final"])
    result = {
        "name": case["name"],
        "init_diff": init_diff,
        "init_worst": init_name,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"])),
        "grad_diff": grad_diff,
        "grad_worst": grad_name,
        "grad_norm_diff": max(abs(a - b) for a, b in zip(norms, ref["grad_norms"])),
        "final_diff": final_diff,
        "final_worst": final_name,
        "losses": losses,
        "shapes": shapes,
        "sequence_parallel_params": sorted(runner.grads.sequence_parallel_names),
        "all_params": sorted(n for n, _ in model.named_parameters()),
        "pipeline_rank": util.pipeline_rank,
        "unsynced_grad_diff": control,
    }
    if case.get("errors"):
        result["errors"] = bad_inputs(model)
    if case.get("pipeline_errors"):  # every stage raises, none waits for the first one
        odd = {k: v[:, :11] for k, v in local_batch(0).items()}
        result["errors"] = {"odd_sequence": _error(lambda: runner.forward_backward(odd))}
    return result


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return None


def bad_inputs(model) -> dict:
    """Messages of the errors raised, before any collective, on the sequence-parallel mesh."""
    odd = torch.zeros(2, 11, dtype=torch.long)  # 11 positions do not split over tp=2
    model.eval()
    with torch.no_grad():
        errors = {
            "odd_sequence": _error(lambda: model(odd)),
            "kv_cache": _error(lambda: model.GPT_model(odd[:, :4], use_cache=True)),
        }
    model.train()
    bert = BertForPreTraining(
        vocab_size=64, hidden_size=32, hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    errors["unsupported_model"] = _error(lambda: ModelRunner(bert))
    return errors


if __name__ == "__main__":
    run_cases(check_case)
