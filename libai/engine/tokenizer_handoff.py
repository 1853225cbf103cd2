"""LiBai's trainer hands its tokenizer to the datasets of ``dataloader.train``.

LiBai's ``DefaultTrainer.build_train_loader`` sets ``dataset.tokenizer = tokenizer`` on each
dataset config before building it, so its configs leave the dataset's ``tokenizer`` out.
:func:`datasets_with_tokenizer` does the same for ``LazyCall`` dataset nodes whose target
takes a ``tokenizer`` and whose config gives none.
"""

from __future__ import annotations

import inspect

from omegaconf import ListConfig

from libai.config import instantiate
from libai.config.instantiate import is_lazy_node, locate


def _takes_tokenizer(node) -> bool:
    target = node["_target_"]
    target = locate(target) if isinstance(target, str) else target
    try:
        return "tokenizer" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def datasets_with_tokenizer(dataset_cfg, tokenizer):
    """The datasets of ``dataset_cfg`` (a node or a list of nodes) built with ``tokenizer``
    where their config has none; ``None`` when no dataset needs it (build the config as is)."""
    if tokenizer is None or dataset_cfg is None:
        return None
    many = isinstance(dataset_cfg, (list, tuple, ListConfig))
    nodes = list(dataset_cfg) if many else [dataset_cfg]
    needs = [is_lazy_node(n) and n.get("tokenizer") is None and _takes_tokenizer(n) for n in nodes]
    if not any(needs):
        return None
    built = [
        instantiate(n, tokenizer=tokenizer) if need else instantiate(n)
        for n, need in zip(nodes, needs)
    ]
    return built if many else built[0]
