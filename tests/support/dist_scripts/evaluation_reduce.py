"""Evaluator results are reduced over dp (and pp) but not tp; writers write on rank 0 only.

On 2 ranks: the dp2 / tp2 / pp2 cases and the writers. On 4 ranks: the layouts where the dp
or pp group is not the whole world (dp2 x tp2, pp2 x dp2, pp2 x tp2, dp4).
"""

from __future__ import annotations

import os

import torch
from common import parse_out_dir, run_checks

from libai import dist
from libai.evaluation import (
    AccEvaluator,
    PPLEvaluator,
    all_reduce_over_data_parallel,
    inference_on_dataset,
)
from libai.utils.events import EventStorage, JSONWriter

# (valid tokens, mean loss) each rank evaluates, by rank
PPL_DATA = {0: [(3, 1.0), (1, 5.0)], 1: [(4, 2.0)]}
# logits / labels: rank 0 gets 1 of 2 right at top-1, rank 1 gets 2 of 2
ACC_DATA = {
    0: (torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]), torch.tensor([0, 2])),
    1: (torch.tensor([[0.0, 3.0, 1.0], [0.0, 1.0, 3.0]]), torch.tensor([1, 2])),
}


def feed(rank: int, evaluators) -> dict:
    for ev in evaluators:
        ev.reset()
    for tokens, loss in PPL_DATA[rank]:
        labels = torch.full((1, tokens + 2), -100)
        labels[0, :tokens] = 7
        evaluators[0].process({"labels": labels}, {"lm_loss": torch.tensor(loss)})
    logits, labels = ACC_DATA[rank]
    evaluators[1].process({"labels": labels}, {"logits": logits})
    out = {}
    for ev in evaluators:
        out.update(ev.evaluate())
    return out


class LossModel(torch.nn.Module):
    """A module whose "loss" is the batch's own number (times a weight of 1)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, labels, loss):
        return {"lm_loss": loss * self.scale}


def checks() -> dict:
    if int(os.environ["WORLD_SIZE"]) == 4:
        return checks_4_ranks()
    result = {}
    evaluators = [PPLEvaluator(), AccEvaluator(topk=(1, 2))]

    dist.setup_dist_util({"data_parallel_size": 2})
    rank = dist.get_rank()
    result["dp2"] = feed(rank, evaluators)
    # a plain module under dp (no pipeline): each rank runs its own batches
    batches = []
    for tokens, loss in PPL_DATA[rank]:
        labels = torch.full((1, tokens + 1), -100)
        labels[0, :tokens] = 5
        batches.append({"labels": labels, "loss": torch.tensor(loss)})
    result["dp2_module"] = inference_on_dataset(LossModel(), batches, PPLEvaluator())

    # tp peers are never summed: give them (unrealistically) different data to prove it
    dist.setup_dist_util({"tensor_parallel_size": 2})
    result["tp2"] = feed(rank, evaluators)

    # pp: only the last stage processes outputs; every rank gets its numbers
    dist.setup_dist_util({"pipeline_parallel_size": 2, "pipeline_num_layers": 2})
    for ev in evaluators:
        ev.reset()
    if dist.get_pipeline_parallel_rank() == 1:
        for tokens, loss in PPL_DATA[0]:
            labels = torch.full((1, tokens), 3)
            evaluators[0].process({"labels": labels}, {"lm_loss": torch.tensor(loss)})
        logits, labels = ACC_DATA[0]
        evaluators[1].process({"labels": labels}, {"logits": logits})
    result["pp2"] = {**evaluators[0].evaluate(), **evaluators[1].evaluate()}
    try:
        inference_on_dataset(torch.nn.Linear(2, 2), [], PPLEvaluator())
        result["pp_module_error"] = ""
    except ValueError as exc:
        result["pp_module_error"] = str(exc)

    # a callable pipeline forward: outputs on the last stage only
    def pipeline_forward(labels):
        if dist.get_pipeline_parallel_rank() != 1:
            return None
        return {"lm_loss": torch.tensor(2.0)}

    data = [{"labels": torch.tensor([[1, 2, -100]])}] * 3
    result["pp2_callable"] = inference_on_dataset(pipeline_forward, data, PPLEvaluator())

    # writers: constructed on every rank, files only from rank 0
    json_path = out_dir / "metrics.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(json_path))
        storage.put_scalars(total_loss=1.0 + rank, time=0.1)
        writer.write()
        writer.close()
    torch.distributed.barrier()
    if rank == 0:
        lines = json_path.read_text().splitlines()
        result["json_lines"] = lines
    return result


# (pp, dp, tp) layouts of 4 ranks; tp innermost, so rank = (pp_idx * dp + dp_idx) * tp + tp_idx
LAYOUTS_4 = {"dp2_tp2": (1, 2, 2), "pp2_dp2": (2, 2, 1), "pp2_tp2": (2, 1, 2), "dp4": (1, 4, 1)}


def checks_4_ranks() -> dict:
    result = {}
    for name, (pp, dp, tp) in LAYOUTS_4.items():
        cfg = {"pipeline_parallel_size": pp, "data_parallel_size": dp, "tensor_parallel_size": tp}
        if pp > 1:
            cfg["pipeline_num_layers"] = pp
        dist.setup_dist_util(cfg)
        rank = dist.get_rank()
        # a number per rank that tells which ranks were summed: 10 ** rank
        values = torch.tensor([10.0**rank, -(10.0**rank)], dtype=torch.float64)
        reduced = all_reduce_over_data_parallel(values)
        result[name] = {
            "sum": reduced.tolist(),
            "input_kept": values.tolist() == [10.0**rank, -(10.0**rank)],
            "coord": [
                dist.get_pipeline_parallel_rank(),
                dist.get_data_parallel_rank(),
                dist.get_tensor_parallel_rank(),
            ],
        }

    # pp2 x dp2: the last stage of each dp replica evaluates that replica's share; every rank
    # gets the totals of both shares
    dist.setup_dist_util({"pipeline_parallel_size": 2, "pipeline_num_layers": 2})
    ppl = PPLEvaluator()
    if dist.get_pipeline_parallel_rank() == 1:
        for tokens, loss in PPL_DATA[dist.get_data_parallel_rank()]:
            ppl.process({"labels": torch.full((1, tokens), 3)}, {"lm_loss": torch.tensor(loss)})
    result["pp2_dp2_ppl"] = ppl.evaluate()
    return result


if __name__ == "__main__":
    out_dir, _, _ = parse_out_dir()
    run_checks(out_dir, checks)
