"""A model's blocks: the units that activation checkpointing, ``torch.compile`` and ZeRO-3
(FSDP2) act on one by one, as torchtitan applies them per Transformer block.

:func:`model_blocks` picks, in order of preference:

1. libai's ``TransformerLayer`` s (every zoo model);
2. the modules a Hugging Face model names in ``_no_split_modules`` (transformers' own list
   of its blocks, e.g. ``BertLayer``, ``GPT2Block``);
3. the stacks of layers: the items of every ``nn.ModuleList`` / ``nn.ModuleDict`` whose items
   are all of one class and hold parameters (a user's network, DistilBERT's layers);
4. the direct children that hold parameters.

Parameter names never change: blocks are compiled in place and checkpointed by wrapping
their ``forward``, not by inserting wrapper modules.
"""

from __future__ import annotations

import torch
from torch import nn

from libai.layers.checkpointing import LAYER_PART_MODES, checkpointed, resolve_mode


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model`` (see the module doc; empty when its parameters all sit on the
    root). A block is never inside another."""
    from libai.layers import TransformerLayer

    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if layers:
        return layers
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    if names:
        blocks = _outermost(m for m in model.modules() if type(m).__name__ in names)
        if blocks:
            return blocks
    stacks = [
        child
        for container in model.modules()
        if isinstance(container, (nn.ModuleList, nn.ModuleDict)) and _is_stack(container)
        for child in container.children()
    ]
    if stacks:
        return _outermost(stacks)
    return [m for m in model.children() if _has_parameters(m)]


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _is_stack(container: nn.Module) -> bool:
    items = list(container.children())
    return len(items) > 1 and len({type(m) for m in items}) == 1 and _has_parameters(items[0])


def _outermost(candidates) -> list[nn.Module]:
    """``candidates`` (in module order) without those inside another candidate."""
    chosen: list[nn.Module] = []
    inside: set[int] = set()
    for m in candidates:
        if id(m) in inside:
            continue
        chosen.append(m)
        inside.update(id(sub) for sub in m.modules())
    return chosen


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


def _checkpoint_forward(block: nn.Module, mode: str) -> None:
    """Make ``block`` recompute its forward in backward (non-reentrant checkpoint of ``mode``)
    while training with grad enabled; its own ``forward`` otherwise."""
    forward = block.forward

    def checkpointed_forward(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpointed(forward, mode, *args, **kwargs)
        return forward(*args, **kwargs)

    block.forward = checkpointed_forward


def enable_activation_checkpointing(
    model: nn.Module,
    mode: str | bool = "full",
    *,
    switch: str = "train.activation_checkpoint",
    no_recompute_layers=(),
) -> int:
    """Recompute every block of ``model`` in backward instead of storing its activations:
    ``mode`` "full" (or True), "selective", or for libai's TransformerLayer "full_attn" /
    "core_attn" (:mod:`libai.layers.checkpointing`); the blocks whose layer index (a
    TransformerLayer's ``layer_idx``, else the block's position) is in
    ``no_recompute_layers`` keep their activations.

    Returns the number of blocks switched; raises if the model has none (the switch must
    never silently do nothing).
    """
    from libai.layers import TransformerLayer

    mode = resolve_mode(mode)
    blocks = model_blocks(model)
    if not blocks:
        raise _no_blocks_error(model, switch)
    skip = set(no_recompute_layers)
    switched = 0
    for index, block in enumerate(blocks):
        if getattr(block, "layer_idx", index) in skip:
            continue  # FleetX's no_recompute_layers: keep this layer's activations
        if isinstance(block, TransformerLayer):
            block.activation_checkpointing = mode
        elif mode in LAYER_PART_MODES:
            raise ValueError(
                f"{switch}.mode={mode!r} recomputes a part of libai's TransformerLayer; "
                f"{type(block).__name__} is not one: use 'full' or 'selective'"
            )
        else:
            _checkpoint_forward(block, mode)
        switched += 1
    return switched


#: ``graph.compile_scope``: what ``torch.compile`` wraps
COMPILE_SCOPES = ("blocks", "model")


def compile_mode(enabled: bool, scope: str | None, *, pipeline: bool, zero_stage=None):
    """The ``compile`` argument of the runner: False, True (each block) or "model" (the
    whole forward), from ``graph.enabled`` and ``graph.compile_scope``; raises naming the
    key for a scope the run cannot take."""
    scope = scope or "blocks"
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"graph.compile_scope must be one of {COMPILE_SCOPES}, got {scope!r}")
    if not enabled or scope == "blocks":
        return bool(enabled)
    if pipeline:
        raise ValueError(
            "graph.compile_scope='model' compiles the model's forward, which pipeline stages "
            "do not call (they run pipeline_forward): use graph.compile_scope='blocks' with "
            "pipeline_parallel_size > 1"
        )
    if zero_stage == 3:
        raise ValueError(
            "graph.compile_scope='model' with ZeRO stage 3 (FSDP2 per block) is not supported: "
            "use graph.compile_scope='blocks'"
        )
    return "model"


def apply_block_switches(
    models,
    *,
    checkpointing: str | bool = False,
    compile: bool | str = False,
    no_recompute_layers=(),
):
    """Activation checkpointing, then ``torch.compile`` (``compile`` True or "blocks": each
    block; "model": the whole ``forward`` of each model, one graph), on the blocks of each of ``models``
    (a rank's model and its pipeline stage copies, after the split: each switches its own
    blocks, so no copy calls another's). A model without blocks (a stage holding only an
    embedding) is left as it is; raises when none of them has one."""
    models = list(models)
    if checkpointing:
        _each_with_blocks(
            models,
            lambda m: enable_activation_checkpointing(
                m, checkpointing, no_recompute_layers=no_recompute_layers
            ),
            "train.activation_checkpoint",
        )
    if compile == "model":  # the whole forward as one graph (compile_mode refuses it under pp)
        for m in models:
            m.compile()
    elif compile:
        _each_with_blocks(models, compile_layers, "graph.enabled")


def _each_with_blocks(models, apply, switch: str) -> None:
    with_blocks = [m for m in models if model_blocks(m)]
    if not with_blocks:
        raise _no_blocks_error(models[0], switch)
    for m in with_blocks:
        apply(m)
