"""Context parallel against one process: GPT-2 and Llama on cp2 (x dp2) and cp2 x tp2, with
ZeRO 1, 2 and 3 over the dp x cp ranks.

For each model and layout: the loss of each step, every gradient of the first step, the
clipped global norm, the parameters after STEPS steps and the evaluation loss equal the
single-process run; and the rank holds its share of every sequence: the blocks see
``seq / cp`` positions, and the bytes autograd saves for backward in one step are measured.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as torch_dist
from common import parse_out_dir, run_checks
from gpt_reference import (
    MAX_GRAD_NORM,
    STEPS,
    make_optimizer,
    max_diff,
)
from memory_probe import saved_activation_bytes
from sp_reference import MODELS
from torch.distributed.tensor import DTensor

from libai import dist
from libai.layers import MultiheadAttention, TransformerLayer
from libai.layers.context_parallel import shard_positions, shard_sequence
from libai.runtime.parallel import ModelRunner
from libai.runtime.zero import prepare_model, shard_optimizer


def block_positions(model) -> list[int]:
    """Records, on each call of the first block, how many positions its input has."""
    seen: list[int] = []
    first = next(m for m in model.modules() if isinstance(m, TransformerLayer))
    first.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    return seen


def check(model_name: str, layout: dict, ref: dict) -> dict:
    build, batch_of, state = MODELS[model_name]
    util = dist.setup_dist_util(dict(layout["dist"]))
    dp, rank = util.data_parallel_size, util.data_parallel_rank
    model = build(**layout.get("model_overrides", {}))
    runner = ModelRunner(model, num_microbatches=layout.get("microbatches", 1))
    positions = block_positions(runner.model)  # a block of this rank's pipeline stage
    if layout.get("zero") == 3:  # FSDP2 over the dp x cp ranks, before the optimizer
        prepare_model(runner, 3)
    optimizer = make_optimizer(model)
    if layout.get("zero"):  # ZeRO 1/2/3 over the dp x cp ranks
        optimizer = shard_optimizer(runner, optimizer, layout["zero"])
    init_diff = max_diff(state(model), ref["init"])[0]
    losses, norms, grads, activation_bytes = [], [], None, 0
    for step in range(STEPS):
        batch = {k: v.chunk(dp)[rank] for k, v in batch_of(step).items()}
        if step == 0:
            out = []

            def first_step(out=out, batch=batch):
                out.append(runner.forward_backward(batch))

            activation_bytes = saved_activation_bytes(model, first_step)
            loss = out[0]
            # ZeRO-2 keeps only the owned gradients: its numbers are the norm and the steps
            grads = None if layout.get("zero") == 2 else state(model, with_grads=True)
        else:
            loss = runner.forward_backward(batch)
        losses.append(float(loss))
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state_numel = sum(
        t.numel() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    model.eval()
    last = {k: v.chunk(dp)[rank] for k, v in batch_of(STEPS).items()}
    rows = last["input_ids"].shape[0]
    want_eval = sum(ref["row_losses"][rank * rows : (rank + 1) * rows]) / rows
    eval_diff = abs(float(runner.eval_loss(last)) - want_eval)
    model.train()
    return {
        "model": model_name,
        "name": layout["name"],
        "cp": util.context_parallel_size,
        "tp": util.tensor_parallel_size,
        "dp": dp,
        "init_diff": init_diff,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"])),
        "grad_diff": None if grads is None else max_diff(grads, ref["grads"]),
        "norm_diff": max(abs(a - b) for a, b in zip(norms, ref["grad_norms"])),
        "final_diff": max_diff(state(model), ref["final"]),
        "eval_diff": eval_diff,
        "losses": losses,
        "block_positions": sorted(set(positions)),
        "sequence_length": batch_of(0)["input_ids"].shape[1],
        "rows": rows,
        "activation_bytes": activation_bytes,
        "zero": layout.get("zero"),
        "optimizer_state_numel": state_numel,
        "parameter_numel": sum(p.numel() for p in model.parameters()),
        # what this rank stores of the parameters (ZeRO-3: its dim-0 shard of each)
        "local_parameter_numel": sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()
        ),
    }


def bidirectional_attention(layout: dict) -> dict:
    """A bidirectional (padding-mask) attention layer on cp ranks against the same attention
    written out on the whole sequence: this rank's output rows, and the weight gradients
    summed over the cp ranks (what the runner's dp x cp reduction does)."""
    util = dist.setup_dist_util(dict(layout["dist"]))
    cp, rank = util.context_parallel_size, util.context_parallel_rank
    torch.manual_seed(7)
    attn = MultiheadAttention(16, 4, attn_mask_type="padding", layer_idx=0)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 8, 16, generator=g)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[0, 6:] = False  # padded keys of the first sample
    out = attn(shard_sequence(x, cp, rank), attention_mask=keep[:, None, None, :])
    out.pow(2).sum().backward()
    grads = {}
    for name, p in attn.named_parameters():
        grad = dist.ttol(p.grad).clone()  # tp shards gathered
        torch_dist.all_reduce(grad, group=util.cp_group)
        grads[name] = grad
    params = {n: p.detach().clone().requires_grad_() for n, p in full_params(attn).items()}
    want = reference_attention(params, x, keep, heads=4)
    want.pow(2).sum().backward()
    positions = shard_positions(8, cp, rank)
    return {
        "out_diff": (out - want[:, positions]).abs().max().item(),
        "grad_diff": max((grads[n] - params[n].grad).abs().max().item() for n in params),
    }


def full_params(module) -> dict:
    return {n: dist.ttol(p.detach()) for n, p in module.named_parameters()}


def reference_attention(params: dict, x, keep, heads: int):
    """Multi-head self-attention on the whole sequence, written out (no causal mask)."""
    b, s, h = x.shape
    qkv = x @ params["query_key_value.weight"].t() + params["query_key_value.bias"]
    q, k, v = qkv.view(b, s, heads, 3, h // heads).unbind(3)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (h // heads) ** 0.5
    scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
    return context @ params["dense.weight"].t() + params["dense.bias"]


def main():
    out_dir, _, rest = parse_out_dir()
    refs = {name: torch.load(path) for name, path in json.loads(rest[0]).items()}
    layouts = json.loads(rest[1])

    def checks():
        results, attention = [], {}
        for layout in layouts:
            for model_name in layout["models"]:
                results.append(check(model_name, layout, refs[model_name]))
            if "pipeline_parallel_size" not in layout["dist"]:  # one layer: no stages
                attention[layout["name"]] = bidirectional_attention(layout)
        return {"results": results, "bidirectional": attention}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
