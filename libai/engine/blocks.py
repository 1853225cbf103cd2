"""A model's blocks: the units that activation checkpointing, ``torch.compile`` and ZeRO-3
(FSDP2) act on one by one, as torchtitan applies them per Transformer block.

For libai's zoo models the blocks are the ``TransformerLayer`` s. Any other ``nn.Module``
(a user's own network brought through the Engine) has as blocks its direct children that
hold parameters (the items of an ``nn.ModuleList`` / ``nn.ModuleDict`` child count one by
one), e.g. the stages of an ``nn.Sequential`` or the sub-networks a ``forward`` chains. Parameter names never change: blocks are compiled in place and checkpointed by
wrapping their ``forward``, not by inserting wrapper modules.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """Every ``TransformerLayer`` of ``model``; for a model without one, its direct children
    that hold parameters, looking through ``nn.ModuleList`` / ``nn.ModuleDict`` containers
    to their items (empty when the model's parameters all sit on the root)."""
    from libai.layers import TransformerLayer

    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if layers:
        return layers
    blocks = []
    for child in model.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            blocks.extend(model_blocks(child))
        elif next(child.parameters(), None) is not None:
            blocks.append(child)
    return blocks


def _no_blocks_error(model: nn.Module, switch: str) -> ValueError:
    return ValueError(
        f"{switch}: {type(model).__name__} has no TransformerLayer and no child module with "
        "parameters to apply it to; split the network into sub-modules (e.g. an nn.Sequential "
        "of blocks) or turn the switch off"
    )


def compile_layers(model: nn.Module, *, switch: str = "graph.enabled", **compile_kwargs) -> int:
    """``torch.compile`` every block of ``model`` in place (names, pipeline pruning and
    checkpoints are unchanged). Returns the number of compiled blocks; raises without any."""
    blocks = model_blocks(model)
    if not blocks:
        raise _no_blocks_error(model, switch)
    for block in blocks:
        block.compile(**compile_kwargs)
    return len(blocks)


def _checkpoint_forward(block: nn.Module) -> None:
    """Make ``block`` recompute its forward in backward (non-reentrant checkpoint) while
    training with grad enabled; its own ``forward`` otherwise."""
    forward = block.forward

    def checkpointed_forward(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    block.forward = checkpointed_forward


def enable_activation_checkpointing(
    model: nn.Module, *, switch: str = "train.activation_checkpoint.enabled"
) -> int:
    """Recompute every block of ``model`` in backward instead of storing its activations.

    Returns the number of blocks switched; raises if the model has none (the switch must
    never silently do nothing).
    """
    from libai.layers import TransformerLayer

    blocks = model_blocks(model)
    if not blocks:
        raise _no_blocks_error(model, switch)
    for block in blocks:
        if isinstance(block, TransformerLayer):
            block.activation_checkpointing = True
        else:
            _checkpoint_forward(block)
    return len(blocks)
