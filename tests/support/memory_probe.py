"""What a forward keeps for backward, measured (shared by the selective-checkpointing and
memory-estimator tests)."""

from __future__ import annotations

import torch


def held_activation_bytes(runner, batch) -> int:
    """Bytes kept from forward for backward: what autograd saves (seen by a saved-tensors
    hook) plus tensors created during forward that Python still holds (selective
    checkpointing keeps its outputs in such a cache), each storage counted once."""
    import gc

    def storages():
        # unreachable cycles first: a tensor only garbage holds (an earlier test's, or a
        # collective's work object awaiting the collector) is not a held activation, and
        # whether the collector ran before this point would otherwise change the count
        gc.collect()
        found = {}
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu":
                    continue
                st = obj.untyped_storage()
                found[st.data_ptr()] = st.nbytes()
            except (AttributeError, ReferenceError, RuntimeError):
                # a dead weak proxy, or a fake / functional tensor that earlier compile
                # tests left behind: no storage of this forward
                continue
        return found

    before = storages()
    packed = {}

    def pack(t):
        st = t.untyped_storage()
        packed[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with runner.autocast():
            loss = runner._loss(runner._context_share(batch))  # a cp rank's share
    held = {k: v for k, v in storages().items() if k not in before}
    held.update({k: v for k, v in packed.items() if k not in before})
    total = sum(held.values())
    loss.backward()
    return total


def saved_activation_bytes(model, run) -> int:
    """Bytes of the activations autograd saves for backward while ``run()`` executes (a
    whole training step, collectives included): saved tensors' storages, each once, the
    parameters of ``model`` left out."""
    weights = {
        (p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
        for p in model.parameters()
    }
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())
