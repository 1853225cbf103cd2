"""SimCSE's contrastive objective (InfoNCE over cosine similarity) and its data-parallel gather.

Each anchor sentence ``i`` is scored against every candidate of the batch: its positive
(column ``i``) and everybody else's positives (in-batch negatives), plus -- in the supervised
setting -- every hard negative (a contradiction of some premise). The loss is the cross
entropy of those scores divided by a temperature, with the anchor's own positive as target.

Under data parallelism each rank holds ``b`` anchors. With ``group`` set the candidates of
all ranks are all-gathered, so every anchor sees the whole global batch of ``b * dp``
candidates, as the SimCSE reference does for multi-GPU training. The gather's backward sums
each rank's gradient with respect to every candidate and hands each rank the part of its
own candidates; together with the trainer's mean over data-parallel gradients this is the
gradient of the single-process loss on the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F

from libai.layers.collectives import all_gather_with_grad


def contrastive_loss(
    embeddings: torch.Tensor,
    temperature: float = 0.05,
    hard_negative_weight: float = 0.0,
    group=None,
) -> torch.Tensor:
    """SimCSE's InfoNCE loss of one batch of sentence embeddings.

    Args:
        embeddings: ``[batch, n, hidden]``; ``[:, 0]`` the anchors, ``[:, 1]`` their
            positives (a second dropout view of the same sentence in unsupervised SimCSE, the
            entailment in supervised SimCSE) and, when ``n == 3``, ``[:, 2]`` hard negatives.
        temperature: the scores are cosine similarities divided by this (0.05 in the paper).
        hard_negative_weight: added to the score of each anchor's *own* hard negative
            (after the temperature; the reference's ``hard_negative_weight``, 0 by default).
        group: a process group whose ranks' candidates join the in-batch negatives
            (the data-parallel group), or ``None`` for this rank's batch only.

    Returns:
        The mean cross entropy over this rank's anchors (float32 scalar).
    """
    if embeddings.dim() != 3 or embeddings.shape[1] not in (2, 3):
        raise ValueError(
            "contrastive_loss needs embeddings [batch, 2 or 3, hidden] (anchor, positive[, hard "
            f"negative]), got shape {tuple(embeddings.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = F.normalize(embeddings.float(), dim=-1)  # cosine similarity = dot of unit vectors
    anchors = z[:, 0]
    candidates = all_gather_with_grad(z[:, 1:].contiguous(), group)  # [global batch, n - 1, hidden]
    offset = 0 if group is None else torch_dist.get_rank(group) * anchors.shape[0]
    targets = torch.arange(anchors.shape[0], device=z.device) + offset
    # [b, H] x [G, H]^T -> [b, G] per candidate kind, then side by side: [b, (n - 1) * G]
    scores = [anchors @ candidates[:, k].T for k in range(candidates.shape[1])]
    logits = torch.cat(scores, dim=1) / temperature
    if len(scores) == 2 and hard_negative_weight:
        own_negative = targets + candidates.shape[0]  # column of each anchor's hard negative
        bonus = torch.zeros_like(logits)
        bonus[torch.arange(anchors.shape[0], device=z.device), own_negative] = hard_negative_weight
        logits = logits + bonus
    return F.cross_entropy(logits, targets)
