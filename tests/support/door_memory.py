"""What one rank holds under a front door's data-parallel / ZeRO switches, measured from the
tensors themselves (never from a config echo), and the check of what each ZeRO stage must
change: optimizer state split from stage 1, gradients from stage 2, parameters at stage 3.

Used by the LiBai (train_net), FleetX (Engine) and Rapidformer (compose) door tests, so a
switch that is read but silently runs another stage fails the same way in each door.
"""

from __future__ import annotations

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def probe_step(optimizer, model) -> dict:
    """Wrap ``optimizer.step`` (the object the door's loop calls) so that its first call
    records ``grad_numel``: the gradient elements this rank holds when it steps (after the dp
    sync; ZeRO-2 keeps only the gradients of the parameters it owns). Returns the record."""
    record: dict = {}
    inner = optimizer.step

    def step(*args, **kwargs):
        if "grad_numel" not in record:
            grads = [_local(p.grad).numel() for p in model.parameters() if p.grad is not None]
            record["grad_numel"] = sum(grads)
        return inner(*args, **kwargs)

    optimizer.step = step
    return record


def holdings(optimizer, model, record: dict) -> dict:
    """This rank's optimizer-state bytes (without the per-parameter ``step`` counters, which
    FSDP keeps on every rank), local parameter elements, and ``record``'s gradient
    elements."""
    state = 0
    for entry in optimizer.state.values():
        for key, value in entry.items():
            if torch.is_tensor(value) and key != "step":
                value = _local(value)
                state += value.numel() * value.element_size()
    return {
        "state_bytes": state,
        "param_numel": sum(_local(p).numel() for p in model.parameters()),
        "grad_numel": record["grad_numel"],
    }


def check_zero_holdings(plain: list[dict], stage: int, runs: list[dict]) -> None:
    """``runs`` (each dp rank's :func:`holdings` under ZeRO ``stage``) against ``plain`` (the
    same ranks without ZeRO, each holding everything): what the stage shards is split
    into disjoint parts that add up to the whole (each rank strictly less); what it does
    not shard stays whole on every rank."""
    keys = ("state_bytes", "grad_numel", "param_numel")
    whole = {k: plain[0][k] for k in keys}
    # plain data parallel replicates everything
    assert all({k: p[k] for k in keys} == whole for p in plain), plain
    assert whole["grad_numel"] == whole["param_numel"], whole
    sharded = {"state_bytes": stage >= 1, "grad_numel": stage >= 2, "param_numel": stage >= 3}
    for key, split in sharded.items():
        held = [r[key] for r in runs]
        if split:
            assert sum(held) == whole[key] and max(held) < whole[key], (stage, key, held, whole)
        else:
            assert held == [whole[key]] * len(runs), (stage, key, held, whole)
