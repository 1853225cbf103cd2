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
            loss = runner._loss(batch)
    held = {k: v for k, v in storages().items() if k not in before}
    held.update({k: v for k, v in packed.items() if k not in before})
    total = sum(held.values())
    loss.backward()
    return total
