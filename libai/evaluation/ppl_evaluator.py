"""Perplexity of a language model: ``exp`` of the mean token loss over the evaluation set."""

from __future__ import annotations

import math

import torch

from libai import dist
from libai.evaluation.evaluator import DatasetEvaluator
from libai.evaluation.utils import all_reduce_over_data_parallel

__all__ = ["PPLEvaluator"]


class PPLEvaluator(DatasetEvaluator):
    """Perplexity ``exp(sum of token losses / number of valid tokens)`` over all batches.

    ``process(inputs, outputs)`` needs only ``outputs[loss_key]`` -- the batch's mean loss
    over its valid tokens (a scalar, as the model's loss returns it) -- and
    ``inputs[label_key]`` to count those tokens (labels ``!= ignore_index``; LiBai's BERT /
    RoBERTa batches count ``loss_mask``, or ``lm_labels``, when ``labels`` is absent). Each batch is
    weighted by its token count, so unequal batches (a short last batch, padding) give the
    exact corpus-level value, not a mean of per-batch perplexities. Token counts and loss
    sums are summed over data-parallel ranks (and pipeline stages: stages that never call
    ``process`` add zeros), so every rank returns the same ``{"ppl": ..., "loss": ...}``.

    Args:
        loss_key: key of the scalar mean loss in the model outputs.
        label_key: key of the labels in the model inputs; ``None`` (default): ``"labels"``,
            or LiBai's ``"lm_labels"`` when the batch has no ``"labels"``.
        ignore_index: label value of positions without a loss.
    """

    def __init__(self, loss_key: str = "lm_loss", label_key: str | None = None, ignore_index=-100):
        self.loss_key, self.label_key, self.ignore_index = loss_key, label_key, ignore_index
        self.reset()

    def reset(self) -> None:
        self._loss_sum: torch.Tensor | None = None  # on the outputs' device: no sync per batch
        self._tokens: torch.Tensor | None = None

    def process(self, inputs, outputs) -> None:
        if self.loss_key not in outputs:
            raise KeyError(
                f"PPLEvaluator needs outputs[{self.loss_key!r}] (the mean token loss); the "
                f"model returned {sorted(outputs)}. Evaluate with labels in the batch."
            )
        mask = self._valid_tokens(inputs)
        loss = dist.ttol(outputs[self.loss_key].detach()).double()
        if loss.numel() != 1:
            raise ValueError(
                f"outputs[{self.loss_key!r}] must be the batch's scalar mean loss, got shape "
                f"{tuple(loss.shape)}"
            )
        tokens = mask.sum().to(loss.device, torch.float64)
        loss_sum = loss.reshape(()) * tokens
        if self._loss_sum is None:
            self._loss_sum, self._tokens = loss_sum, tokens
        else:
            self._loss_sum = self._loss_sum + loss_sum
            self._tokens = self._tokens + tokens

    def _valid_tokens(self, inputs) -> torch.Tensor:
        """Where the loss counts: ``inputs[label_key] != ignore_index``; for LiBai's masked-LM
        batches (no ``labels``) ``loss_mask != 0``, else ``lm_labels != ignore_index``."""
        key = self.label_key or "labels"  # None: "labels", or LiBai's names without it
        if key in inputs:
            return dist.ttol(inputs[key]) != self.ignore_index
        if key == "labels" and "loss_mask" in inputs:
            return dist.ttol(inputs["loss_mask"]) != 0
        if key == "labels" and "lm_labels" in inputs:
            return dist.ttol(inputs["lm_labels"]) != self.ignore_index
        raise KeyError(
            f"PPLEvaluator needs inputs[{key!r}] (or LiBai's loss_mask / lm_labels) "
            f"to count the valid tokens; the batch has {sorted(inputs)}."
        )

    def evaluate(self) -> dict:
        local = torch.zeros(2, dtype=torch.float64)
        if self._loss_sum is not None:
            local = torch.stack([self._loss_sum, self._tokens]).cpu()
        loss_sum, tokens = all_reduce_over_data_parallel(local).tolist()
        if tokens == 0:
            return {"ppl": float("nan"), "loss": float("nan")}
        loss = loss_sum / tokens
        try:
            ppl = math.exp(loss)
        except OverflowError:
            ppl = float("inf")
        return {"ppl": ppl, "loss": loss}
