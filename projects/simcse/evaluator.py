"""Spearman correlation between the model's cosine similarities and gold STS scores."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as torch_dist

from libai import dist
from libai.evaluation import DatasetEvaluator


def average_ranks(values) -> np.ndarray:
    """1-based ranks of ``values``; tied values share the mean of the ranks they span
    (``[10, 20, 20, 30]`` -> ``[1, 2.5, 2.5, 4]``)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_run = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    run = np.cumsum(starts_run) - 1  # run (group of ties) of each sorted position
    first = np.flatnonzero(starts_run)  # 0-based sorted position where each run starts
    last = np.append(first[1:], len(values)) - 1
    ranks = np.empty(len(values))
    ranks[order] = (first + last)[run] / 2.0 + 1.0
    return ranks


def spearman(x, y) -> float:
    """Spearman's rank correlation of ``x`` and ``y``: the Pearson correlation of their
    average ranks. ``nan`` for fewer than two pairs or a constant input."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"spearman needs two sequences of one length, got {x.shape} and {y.shape}")
    if x.size < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")


class SpearmanEvaluator(DatasetEvaluator):
    """STS evaluation: ``{"spearman": rho}`` between predicted cosine similarities and the
    gold scores ``inputs[label_key]``, over the whole evaluation set (all data-parallel ranks).

    Predictions come from ``outputs["cos_sim"]`` (``[B]``, the model's eval output), or are
    the cosine of the first two sentence embeddings ``[B, >=2, H]`` in ``outputs["embeddings"]``
    or ``outputs["logits"]`` (what the trainer hands over from the model's
    ``pipeline_forward``).
    """

    needs_predictions = True

    def __init__(self, label_key: str = "labels"):
        self.label_key = label_key
        self.reset()

    def reset(self) -> None:
        self._predictions: list[np.ndarray] = []
        self._golds: list[np.ndarray] = []

    @staticmethod
    def _cosines(outputs) -> torch.Tensor:
        if "cos_sim" in outputs:
            return outputs["cos_sim"]
        for key in ("embeddings", "logits"):
            if key in outputs:
                emb = outputs[key]
                if emb.dim() != 3 or emb.shape[1] < 2:
                    raise ValueError(
                        f"SpearmanEvaluator needs outputs[{key!r}] of sentence-pair embeddings "
                        f"[batch, 2, hidden], got shape {tuple(emb.shape)}: evaluate on pairs "
                        "(an STSDataset)."
                    )
                emb = emb.float()
                return torch.nn.functional.cosine_similarity(emb[:, 0], emb[:, 1], dim=-1)
        raise KeyError(
            "SpearmanEvaluator needs outputs 'cos_sim', 'embeddings' or 'logits'; got "
            f"{sorted(outputs)}"
        )

    def process(self, inputs, outputs) -> None:
        if self.label_key not in inputs:
            raise KeyError(
                f"SpearmanEvaluator needs the gold scores inputs[{self.label_key!r}]; the batch "
                f"has {sorted(inputs)}."
            )
        cosines = dist.ttol(self._cosines(outputs).detach()).float().reshape(-1)
        golds = dist.ttol(inputs[self.label_key]).float().reshape(-1)
        if cosines.shape != golds.shape:
            raise ValueError(
                f"{cosines.numel()} predicted similarities for {golds.numel()} gold scores"
            )
        self._predictions.append(cosines.cpu().numpy())
        self._golds.append(golds.cpu().numpy())

    def _all_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, golds) of every data-parallel rank (tensor-parallel peers hold the
        same ones and are not counted twice)."""
        local = (
            np.concatenate(self._predictions) if self._predictions else np.zeros(0),
            np.concatenate(self._golds) if self._golds else np.zeros(0),
        )
        group = dist.get_dist_util().dp_group if torch_dist.is_initialized() else None
        if group is None:
            return local
        shards = [None] * torch_dist.get_world_size(group)
        torch_dist.all_gather_object(shards, local, group=group)
        return np.concatenate([p for p, _ in shards]), np.concatenate([g for _, g in shards])

    def evaluate(self) -> dict:
        predictions, golds = self._all_pairs()
        return {"spearman": spearman(predictions, golds)}
