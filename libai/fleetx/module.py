"""FleetX's model-integration standard: a task ``BasicModule`` wraps a plain network.

The user writes the network (any ``nn.Module``, or a libai zoo model), wraps it in a
subclass of :class:`BasicModule` that says how a batch becomes a loss, and hands that to
:class:`~libai.fleetx.engine.Engine`, which runs it on the mesh with every switch of the
config. Hooks keep FleetX's names; those FleetX documented but never built
(``configure_optimizers``, ``validation_epoch_end``, ``predict_step``, ...) work here.

When the Engine calls what (``docs/integrate_a_model.md`` has the full order)::

    __init__(cfg)               self.configs = process_configs(cfg) (self.cfg: the same);
                                self.model = get_model(); self.loss_fn = get_loss_fn()
    configure_optimizers()      once, Engine(mode="train"); None -> Optimizer section
    fit:       per step: pretreating_batch -> (training_step -> backward) per micro-batch
               -> optimizer step -> training_step_end(log_dict) every Engine.logging_freq
               -> training_epoch_end(log_dict) after an epoch's last step
    evaluate:  per batch: pretreating_batch -> validation_step -> validation_step_end
               every logging_freq; then validation_epoch_end(log_dict)
    predict:   per batch: pretreating_batch -> test_step -> test_step_end every logging_freq
    inference: pretreating_batch -> predict_step -> predict_step_end (eager model), or the
               exported ONNX graph -> inference_end (Inference.model_dir)
    export:    input_spec() -> ONNX (zoo models use their own graph specs)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["BasicModule", "InputSpec", "call_with_batch"]


@dataclass(frozen=True)
class InputSpec:
    """One input of the exported graph (FleetX's ``InputSpec``): ``shape`` with ``None`` for
    a dynamic axis, ``dtype`` (``"float32"``, ``"int64"``, ... or a torch dtype), ``name``.
    Integer inputs are drawn from ``[0, high)`` when the exporter makes example values."""

    shape: Sequence[int | None]
    dtype: str | torch.dtype = "float32"
    name: str = "x"
    high: int = 2

    @property
    def torch_dtype(self) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        dtype = getattr(torch, str(self.dtype), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"InputSpec {self.name!r}: unknown dtype {self.dtype!r}")
        return dtype


def call_with_batch(fn, batch):
    """``fn(**batch)`` for a mapping, ``fn(*batch)`` for a list or tuple, else ``fn(batch)``."""
    if isinstance(batch, Mapping):
        return fn(**batch)
    if isinstance(batch, (list, tuple)):
        return fn(*batch)
    return fn(batch)


class BasicModule(nn.Module):
    """A task: the network (``self.model``) and how batches become losses and outputs.

    Subclasses implement :meth:`get_model` and usually :meth:`training_step`; everything
    else has a working default. The Engine parallelizes, checkpoints and exports
    ``self.model`` (so a module keeps all its parameters there).

    Class attribute ``libai_model``: ``True`` when :meth:`get_model` returns a model built
    from libai layers (a zoo model), which enables ``Distributed.mp_degree`` /
    ``pp_degree``; a plain ``nn.Module`` runs data parallel, with ZeRO / sharding, AMP,
    recompute and compile.
    """

    libai_model: bool = False

    def __init__(self, cfg):
        super().__init__()
        processed = self.process_configs(cfg)
        #: the run's config (FleetX's name; ``self.cfg`` is the same object)
        self.configs = cfg if processed is None else processed
        self.model = self.get_model()
        self.loss_fn = self.get_loss_fn()

    @property
    def cfg(self):
        """``self.configs`` (the name this library's modules use)."""
        return self.configs

    def process_configs(self, configs):
        """FleetX's hook: adjust the config before the model is built; returns it (or
        ``None`` to keep the one given, changed in place). Default: unchanged."""
        return configs

    # ---- building -----------------------------------------------------------------------------
    def get_model(self) -> nn.Module:
        """The network (built after the mesh exists, so zoo models get their shards)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_model()")

    def get_loss_fn(self):
        """A loss callable stored as ``self.loss_fn`` (default ``None``)."""
        return None

    def configure_optimizers(self):
        """``(optimizer, lr_scheduler)``, an optimizer alone, or ``None`` (default): both
        then come from the config's ``Optimizer`` section. Build them over
        ``self.model.parameters()`` (called after ZeRO-3 sharding, so they see the shards)."""
        return None

    # ---- training -----------------------------------------------------------------------------
    def pretreating_batch(self, batch):
        """Reshape a loader batch (already on the device) before any step; default identity."""
        return batch

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def training_step(self, batch):
        """The loss of one micro-batch: a tensor, or a mapping whose keys containing "loss"
        are summed. Default: the libai model contract, ``self(**batch)``'s losses."""
        return call_with_batch(self, batch)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch loss (already scaled for fp16 and divided by the
        micro-batch count)."""
        loss.backward()

    def training_step_end(self, log_dict: dict) -> None:
        """Every ``Engine.logging_freq`` steps: ``epoch, total_epoch, batch, total_batch,
        total_step, loss, lr, train_cost`` (+ ``tokens_per_sec``, ``loss_scale``,
        ``found_inf`` when they apply). The console / metrics.json / TensorBoard writers log
        on their own; this hook is for extra reporting."""

    def training_epoch_end(self, log_dict: dict) -> None:
        """After the last step of each epoch: ``epoch, total_epoch, loss, train_cost``."""

    # ---- evaluation, test, prediction ---------------------------------------------------------
    def validation_step(self, batch):
        """The loss of an evaluation batch (a tensor, or a mapping with ``"loss"``; other
        numbers in the mapping are summed over batches and ranks into
        ``log_dict["sums"]`` of :meth:`validation_epoch_end`). Default: :meth:`training_step`."""
        return self.training_step(batch)

    def validation_step_end(self, log_dict: dict) -> None:
        """Every ``logging_freq`` evaluation batches: ``loss, epoch, batch, total_batch,
        eval_cost``."""

    def validation_epoch_end(self, log_dict: dict) -> dict | None:
        """After an evaluation: ``epoch, loss, eval_cost, total_batch, sums``; may return
        extra metrics (e.g. ``{"acc": ...}``) that join the evaluation results."""
        return None

    def test_step(self, batch):
        """The loss of a test batch (``Engine.predict``). Default: :meth:`validation_step`."""
        return self.validation_step(batch)

    def test_step_end(self, log_dict: dict) -> None:
        """Every ``logging_freq`` test batches: ``loss, epoch, batch, total_batch, test_cost``."""

    def predict_step(self, batch):
        """Outputs for a batch without labels (``Engine.inference`` on the eager model).
        Default: ``self(**batch)``."""
        return call_with_batch(self, batch)

    def predict_step_end(self, outputs):
        """Post-process :meth:`predict_step`'s outputs (default: unchanged)."""
        return outputs

    # ---- export and deployment ----------------------------------------------------------------
    def input_spec(self) -> list[InputSpec]:
        """The exported graph's inputs, in the order ``self.model.forward`` takes them."""
        raise NotImplementedError(
            f"{type(self).__name__}.input_spec() is needed to export a model that is not in "
            "the zoo: return a list of InputSpec(shape=[None, ...], dtype=..., name=...)"
        )

    def onnx_predictor(self, model_dir: str):
        """What runs the exported graph for ``Engine.inference``: a callable from a batch to
        outputs. Default: :class:`~libai.fleetx.export.OnnxPredictor` (one forward)."""
        from libai.fleetx.export import OnnxPredictor

        return OnnxPredictor(model_dir)

    def inference_end(self, outputs):
        """Post-process the exported graph's outputs (``{name: array}``; default unchanged)."""
        return outputs
