"""Top-k accuracy of classification or token prediction."""

from __future__ import annotations

import torch

from libai import dist
from libai.evaluation.evaluator import DatasetEvaluator
from libai.evaluation.utils import all_reduce_over_data_parallel

__all__ = ["AccEvaluator", "ClsEvaluator"]


class AccEvaluator(DatasetEvaluator):
    """``Acc@k``: percentage (0-100, as in LiBai) of targets among the top-k scores.

    Scores come from ``outputs["logits"]`` or ``outputs["prediction_scores"]`` (the first
    present, or ``logits_key``), shaped ``[..., num_classes]``; targets from
    ``inputs["labels"]`` (LiBai's ``ns_labels`` when a sentence-pair batch has no ``labels``)
    shaped ``[...]`` (so per-token prediction ``[B, S, V]`` / ``[B, S]``
    and classification ``[B, C]`` / ``[B]`` both work). Targets equal to ``ignore_index`` are
    not counted. ``k`` above the number of classes is capped (every target is then in the
    top-k). Counts are summed over data-parallel ranks; every rank returns the same dict,
    e.g. ``{"Acc@1": 41.2, "Acc@5": 77.0}``.
    """

    needs_predictions = True

    def __init__(
        self,
        topk: tuple[int, ...] = (1,),
        logits_key: str | None = None,
        label_key: str = "labels",
        ignore_index: int = -100,
    ):
        if isinstance(topk, int):
            topk = (topk,)
        if not topk or any(int(k) < 1 for k in topk):
            raise ValueError(f"topk must be positive integers, got {topk!r}")
        self.topk = tuple(int(k) for k in topk)
        self.logits_key, self.label_key, self.ignore_index = logits_key, label_key, ignore_index
        self.reset()

    def reset(self) -> None:
        self._counts: torch.Tensor | None = None  # [correct@k..., total], on the outputs' device

    def _scores(self, outputs) -> torch.Tensor:
        keys = [self.logits_key] if self.logits_key else ["logits", "prediction_scores"]
        for key in keys:
            if key in outputs:
                return dist.ttol(outputs[key].detach())
        raise KeyError(f"AccEvaluator needs outputs {' or '.join(keys)}; got {sorted(outputs)}")

    def process(self, inputs, outputs) -> None:
        scores = self._scores(outputs)
        key = self.label_key
        if key == "labels" and key not in inputs and "ns_labels" in inputs:
            key = "ns_labels"  # LiBai's sentence-pair batch (its BertForClassification's labels)
        if key not in inputs:
            raise KeyError(f"AccEvaluator needs inputs[{self.label_key!r}]; got {sorted(inputs)}")
        labels = dist.ttol(inputs[key]).to(scores.device)
        if scores.shape[:-1] != labels.shape:
            raise ValueError(
                f"scores {tuple(scores.shape)} do not match labels {tuple(labels.shape)}: "
                "expected scores [..., num_classes] for labels [...]"
            )
        scores = scores.reshape(-1, scores.shape[-1])
        labels = labels.reshape(-1)
        valid = labels != self.ignore_index
        scores, labels = scores[valid], labels[valid]
        maxk = min(max(self.topk), scores.shape[-1])
        top = scores.topk(maxk, dim=-1).indices  # [N, maxk], best first
        hit = top.eq(labels.unsqueeze(-1))  # at most one True per row
        counts = [hit[:, : min(k, maxk)].any(dim=-1).sum() for k in self.topk]
        counts.append(torch.tensor(labels.numel(), device=scores.device))
        counts = torch.stack(counts).to(torch.float64)
        self._counts = counts if self._counts is None else self._counts + counts

    def evaluate(self) -> dict:
        local = torch.zeros(len(self.topk) + 1, dtype=torch.float64)
        if self._counts is not None:
            local = self._counts.cpu()
        *correct, total = all_reduce_over_data_parallel(local).tolist()
        return {
            f"Acc@{k}": (100.0 * c / total if total else float("nan"))
            for k, c in zip(self.topk, correct)
        }


class ClsEvaluator(AccEvaluator):
    """LiBai's name for classification accuracy: :class:`AccEvaluator` with ``topk=(1, 5)``."""

    def __init__(self, topk: tuple[int, ...] = (1, 5), **kwargs):
        super().__init__(topk=topk, **kwargs)
