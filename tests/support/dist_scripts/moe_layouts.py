"""Expert parallel against the single-process references (tests/distributed/test_moe_layouts.py).

For every case (a variant of the tiny MoE Llama and a layout): the initial weights, each
step's loss and loss terms, every gradient of the first step, the clipping norms and every
parameter (and expert bias) after STEPS steps equal the reference; the layout is measured:
each rank's expert weights (their local shapes and bytes), and the rows each rank's experts
received in the first forward against the router's assignments of the whole ep group,
counted here from the gathered routing.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from common import run_cases
from gpt_reference import max_diff
from moe_reference import build_moe_llama, make_optimizer, moe_batch, moe_state, momenta, train

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.layers import MoE
from libai.layers.moe_dispatch import capacity_keep, capacity_slots
from libai.layers.param import local_value
from libai.runtime.parallel import ModelRunner
from libai.runtime.zero import prepare_model, shard_optimizer


def watch_routing(model) -> tuple[dict, list]:
    """Hooks recording, for each local MoE layer's first forward, the expert ids its router
    chose and the rows its experts received."""
    seen, handles = {}, []
    for name, moe in ((n, m) for n, m in model.named_modules() if isinstance(m, MoE)):

        def on_router(module, args, out, name=name):
            seen.setdefault(name + ".experts", out.experts.detach().clone())

        def on_experts(module, args, out, name=name):
            seen.setdefault(name + ".received", int(args[0].shape[0]))

        handles.append(moe.router.register_forward_hook(on_router))
        handles.append(moe.experts.register_forward_hook(on_experts))
        handles.append(watch_padded(moe.experts, seen, name))
    return seen, handles


class watch_padded:
    """Records the shape of the padded buffer ``experts.forward_padded`` receives (capacity
    mode padded to static shapes); ``remove()`` restores the method."""

    def __init__(self, experts, seen: dict, name: str):
        run, self.experts = experts.forward_padded, experts

        def recorded(rows):
            seen.setdefault(name + ".received", list(rows.shape))
            return run(rows)

        experts.forward_padded = recorded

    def remove(self):
        del self.experts.forward_padded


def expected_padded(util, local_batch: int) -> list[int]:
    """The buffer each rank's experts receive in padded capacity mode: for each of its
    ``E / ep`` experts ``capacity`` rows per sequence of each ep rank (4 = ceil(0.6 * 12 * 2
    / 4), the sequence whole under sequence parallel too)."""
    ep = util.expert_parallel_size
    return [4 // ep, ep * local_batch * 4, 32]


def expected_rows(experts: torch.Tensor, util, num_experts: int) -> int:
    """The assignments of the ep group's tokens to this rank's experts, from the gathered
    routing (dropless)."""
    group = util.ep_group
    if group is None:
        return int(experts.numel())
    parts = [torch.empty_like(experts) for _ in range(torch_dist.get_world_size(group))]
    torch_dist.all_gather(parts, experts.contiguous(), group=group)
    per_rank = num_experts // util.expert_parallel_size
    first = util.expert_parallel_rank * per_rank
    every = torch.cat([p.flatten() for p in parts])
    return int(((every >= first) & (every < first + per_rank)).sum())


def check_case(case: dict, refs: dict) -> dict:
    util = dist.setup_dist_util(case["dist"])
    dp = util.layout.data_parallel_size
    microbatches = case.get("microbatches", 1)
    ref = refs[case["variant"] + (f"/mb{microbatches}" if microbatches > 1 else "")]
    model = build_moe_llama(case["variant"])
    runner = ModelRunner(model, num_microbatches=microbatches, **case.get("runner", {}))
    stage = case.get("zero")
    # ZeRO-3: FSDP2 over dp (HSDP: replicated over hsdp groups), experts left to their ranks
    prepare_model(runner, stage, hsdp_replicate_size=case.get("hsdp", 1))
    init_diff, init_name = max_diff(moe_state(model), ref["init"])

    def local_batch(step):
        """This dp rank's rows: of each of the reference's micro-batches its dp share, so
        a micro-batch here holds the dp share of the reference's (the balancing statistics
        are per micro-batch over the dp ranks)."""
        rank = util.data_parallel_rank
        return {
            k: torch.cat([mb.chunk(dp)[rank] for mb in v.chunk(microbatches)])
            for k, v in moe_batch(step).items()
        }

    seen, handles = watch_routing(model)
    runner.forward_backward(local_batch(0))  # the routing of the first step, then dropped
    for handle in handles:
        handle.remove()
    model.zero_grad(set_to_none=True)
    for module in model.modules():  # the balancing counts of that extra forward
        if isinstance(module, MoE) and module.router.expert_bias is not None:
            module.router.tokens_per_expert.zero_()
    routing = {}
    for name in sorted(k[: -len(".experts")] for k in seen if k.endswith(".experts")):
        padded = case["variant"] == "padded"
        rows = local_batch(0)["input_ids"].shape[0]
        routing[name] = {
            "received": seen[name + ".received"],
            "expected": expected_padded(util, rows)
            if padded
            else expected_rows(seen[name + ".experts"], util, 4),
        }
    optimizer = make_optimizer(model)
    if stage is not None:
        optimizer = shard_optimizer(runner, optimizer, stage)
    out = train(runner, local_batch, moe_state, optimizer)
    held = {  # what this rank keeps optimizer state for: experts, and under ZeRO its share
        "expert_states": sum(
            1 for n, p in model.named_parameters() if ".experts." in n and p in optimizer.state
        ),
        "dense_states": sum(
            1 for n, p in model.named_parameters() if ".experts." not in n and p in optimizer.state
        ),
        "dense_params": sum(1 for n, _ in model.named_parameters() if ".experts." not in n),
    }
    if case.get("save_to"):  # for the test to load on one process
        Checkpointer(model, case["save_to"], optimizer=out["optimizer"]).save("model_final")
    grad_diff, grad_name = max_diff(out["grads"], ref["grads"])
    final_diff, final_name = max_diff(moe_state(model), ref["final"])
    experts = {
        n: {"local": list(local_value(p).shape), "bytes": local_value(p).nbytes}
        for n, p in model.named_parameters()
        if n.endswith("experts.w_up")
    }
    terms = [t for t in out["terms"] if t]
    return {
        "name": case["name"],
        "pipeline_rank": util.pipeline_rank,
        "init_diff": init_diff,
        "init_worst": init_name,
        "loss_diff": max(abs(a - b) for a, b in zip(out["losses"], ref["losses"])),
        "lm_loss_diff": max(abs(a - b["lm_loss"]) for a, b in zip(out["losses"], ref["terms"])),
        "term_diff": max(
            (abs(v - want[k]) for got, want in zip(terms, ref["terms"]) for k, v in got.items()),
            default=None,
        ),
        "grad_diff": grad_diff,
        "grad_worst": grad_name,
        "grad_norm_diff": max(abs(a - b) for a, b in zip(out["grad_norms"], ref["grad_norms"])),
        "final_diff": final_diff,
        "final_worst": final_name,
        "experts": experts,
        "routing": routing,
        "momentum_diff": max_diff(out["momenta"], ref["momenta"])[0],
        "held": held,
        "errors": bad_inputs(case) if case.get("errors") else None,
        "shares": capacity_of_shares(util) if case.get("shares") else None,
        **(load_checkpoint(case, ref) if case.get("load_from") else {}),
    }


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return None


def bad_inputs(case: dict) -> dict:
    """The one-line errors of this layout, raised before any collective."""
    from libai.layers import MoEConfig
    from libai.layers.moe import MoE as MoELayer
    from libai.models import LlamaForCausalLM

    tiny = dict(hidden_layers=1, vocab_size=32, hidden_size=32, intermediate_size=48)
    tiny.update(num_attention_heads=4, max_position_embeddings=64)
    errors = {
        "dense_model": _error(lambda: ModelRunner(LlamaForCausalLM(**tiny))),
        "experts_not_divisible": _error(lambda: MoELayer(32, 48, MoEConfig(num_experts=3))),
    }
    if dist.get_dist_util().context_parallel_size > 1:
        config = MoEConfig(num_experts=4, capacity_factor=1.0)
        errors["capacity_under_cp"] = _error(lambda: MoELayer(32, 48, config))
    return errors


def capacity_of_shares(util) -> dict:
    """Capacity slots under sequence parallel from this tp rank's share of a fixed routing,
    against one process numbering the whole sequence: the shares route to different experts
    (the last tp rank's share never to the highest one), so each rank counts all E experts
    whatever its share picks."""
    num_experts, capacity, tp = 4, 3, util.tensor_parallel_size
    # [batch 1, seq 8, top-2]; the second half routes to experts 0-2 only
    whole = torch.tensor([[[0, 1], [2, 3], [3, 0], [1, 0], [2, 1], [0, 2], [1, 2], [0, 1]]])
    share = whole.chunk(tp, dim=1)[util.tensor_parallel_rank]
    slots = capacity_slots(whole, num_experts).chunk(tp, dim=1)[util.tensor_parallel_rank]
    return {
        "slots_equal": torch.equal(capacity_slots(share, num_experts, util.tp_group), slots),
        "keep_equal": torch.equal(
            capacity_keep(share, num_experts, capacity, util.tp_group), slots < capacity
        ),
    }


def load_checkpoint(case: dict, ref: dict) -> dict:
    """A fresh model and optimizer on this layout loaded from the one-process reference's
    checkpoint: its parameters, expert biases and momenta equal the reference's final ones."""
    model = build_moe_llama(case["variant"])
    optimizer = make_optimizer(model)
    Checkpointer(model, case["load_from"], optimizer=optimizer).load(
        case["load_from"] + "/model_final"
    )
    return {
        "loaded_diff": max_diff(moe_state(model), ref["final"])[0],
        "loaded_momentum_diff": max_diff(momenta(model, optimizer), ref["momenta"])[0],
    }


if __name__ == "__main__":
    run_cases(check_case)
