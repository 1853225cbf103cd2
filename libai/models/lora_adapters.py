"""Several PEFT adapters on one libai model, chosen per request at run time.

:func:`load_peft_adapters` loads each adapter as :func:`~libai.models.lora_peft.load_peft_adapter`
does (any layout, each rank its shard, the same checks against the base), keeps each one's
:class:`~libai.layers.lora.LoRA` modules apart, and puts an
:class:`~libai.layers.lora_set.AdapterSet` on every layer some adapter targets. The returned
:class:`~libai.layers.lora_set.AdapterRouting` says, during a forward, which adapter each
token uses (``with routing.route(slots): model(...)``); outside a route the model is the base.
"""

from __future__ import annotations

from torch import nn

from libai.layers.lora_set import AdapterRouting, AdapterSet
from libai.models.lora import LORA_ATTR, lora_layers
from libai.models.lora_peft import load_peft_adapter

#: the model attribute holding the routing of its adapters
ROUTING_ATTR = "libai_adapter_routing"


def load_peft_adapters(model: nn.Module, adapters: dict[str, str]) -> AdapterRouting:
    """Load the PEFT adapter directories ``adapters`` (name -> path) onto ``model`` side by
    side; adapter ``i`` of the routing is the ``i``-th of ``adapters``. An adapter that
    does not fit the base, or that saves whole modules (it would replace base weights),
    raises naming it; a model that already carries adapters raises."""
    if lora_layers(model) or adapter_routing(model) is not None:
        raise ValueError(
            "the model already carries LoRA adapters: merge them into the base first (a "
            "pipeline's lora_adapter= / libai-serve's --lora-adapter merges)"
        )
    if not adapters:
        raise ValueError("no adapters to load: give at least one name -> PEFT directory")
    routing = AdapterRouting(list(adapters))
    per_layer: dict[str, dict] = {}
    try:
        for index, (name, path) in enumerate(adapters.items()):
            try:
                load_peft_adapter(model, str(path), whole_modules=False)
            except (ValueError, FileNotFoundError) as error:
                raise type(error)(f"adapter {name!r}: {error}") from error
            for layer_name, layer in lora_layers(model).items():
                per_layer.setdefault(layer_name, {})[index] = layer.lora
                layer.lora = None
            model.__dict__.pop(LORA_ATTR, None)
    except BaseException:
        for layer in lora_layers(model).values():  # the one being loaded when it failed
            layer.lora = None
        model.__dict__.pop(LORA_ATTR, None)
        raise
    modules = dict(model.named_modules())
    for layer_name, loras in per_layer.items():
        modules[layer_name].lora = AdapterSet(loras, routing)
    model.__dict__[ROUTING_ATTR] = routing
    return routing


def adapter_routing(model: nn.Module) -> AdapterRouting | None:
    """The routing of the adapters :func:`load_peft_adapters` put on ``model``, or None."""
    return model.__dict__.get(ROUTING_ATTR)
