"""FleetX's offline GPT evaluation as a task module: ``Model.module: GPTEvalModule`` with an
``Offline_Eval`` section (FleetX's ``eval_gpt_345M_single_card.yaml``)."""

from __future__ import annotations

import logging
import math

import torch.nn.functional as F
from omegaconf import OmegaConf

from libai.fleetx.modules.gpt import GPTModule

logger = logging.getLogger(__name__)

__all__ = ["GPTEvalModule"]

#: Offline_Eval keys and their defaults (FleetX's)
OFFLINE_EVAL = {
    "eval_path": None,
    "cloze_eval": False,
    "overlapping_eval": None,
    "batch_size": 8,
    "max_seq_len": 1024,
    "logging_freq": 1,
}


class GPTEvalModule(GPTModule):
    """WikiText perplexity or LAMBADA last-word accuracy of a GPT on a local file, as
    FleetX's ``GPTEvalModule``: ``tools/eval.py -c eval_gpt_345M_single_card.yaml -o
    Offline_Eval.eval_path=... -o Engine.save_load.ckpt_dir=...`` (or ``Model.pretrained``).

    ``Offline_Eval``: ``eval_path`` (the file), ``cloze_eval`` (False: perplexity with
    ``LM_Eval_Dataset``, windows every ``overlapping_eval`` tokens; True: LAMBADA accuracy
    with ``Lambada_Eval_Dataset``), ``batch_size``, ``max_seq_len``, ``logging_freq``. The
    section replaces ``Data`` (the whole file is evaluated, ``Engine.eval_iters: 0``).

    Results (``Engine.evaluate``): perplexity: ``avg_loss`` (the mean NLL over every target
    token of the file), ``ppl`` (``exp(min(20, avg_loss))``), ``adjusted_ppl`` (per original
    WikiText word) and ``token_ratio``; cloze: ``acc``, ``num_correct``, ``num_examples``.
    Runs on one process, data parallel and tensor parallel (not pipeline parallel: the
    per-token scores need the logits on every stage).
    """

    def process_configs(self, configs):
        if configs.get("Offline_Eval") is None:
            raise ValueError(
                "GPTEvalModule needs an Offline_Eval section (eval_path, cloze_eval, "
                "overlapping_eval, batch_size, max_seq_len, logging_freq)"
            )
        given = OmegaConf.to_container(configs.Offline_Eval, resolve=True)
        unknown = sorted(set(given) - set(OFFLINE_EVAL))
        if unknown:
            raise ValueError(
                f"unknown config key Offline_Eval.{unknown[0]} (known: {', '.join(OFFLINE_EVAL)})"
            )
        self.eval_cfgs = {**OFFLINE_EVAL, **given}
        ev = self.eval_cfgs
        if not ev["eval_path"]:
            raise ValueError("Offline_Eval.eval_path is required: the WikiText / LAMBADA file")
        dataset = {"input_dir": ev["eval_path"], "max_seq_len": int(ev["max_seq_len"])}
        if ev["cloze_eval"]:
            dataset["name"] = "Lambada_Eval_Dataset"
        else:
            dataset["name"] = "LM_Eval_Dataset"
            dataset["overlapping_eval"] = ev["overlapping_eval"]
        configs.Data = {
            "Train": None,
            "Test": None,
            "Eval": {
                "dataset": dataset,
                "sampler": {"name": "SingleRoundSampler", "shuffle": False},
                "loader": {"collate_fn": "default"},
            },
        }
        batch = int(ev["batch_size"])
        data_ranks = int(configs.Distributed.dp_degree or 1) * int(
            configs.Distributed.sharding.sharding_degree
        )
        configs.Global.local_batch_size = configs.Global.micro_batch_size = batch
        configs.Global.global_batch_size = batch * data_ranks
        configs.Engine.eval_iters = 0  # the whole file
        configs.Engine.logging_freq = int(ev["logging_freq"])
        self.info = None
        return configs

    def pretreating_batch(self, batch):
        """The batch as the evaluation sets give it (their ``loss_mask`` is read here)."""
        return batch

    def validation_step(self, batch):
        """Per batch: the summed NLL of the scored targets (perplexity) or the number of
        examples whose every target token is the argmax (cloze)."""
        logits = self.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        logits = logits["logits"].float()
        labels, mask = batch["labels"], batch["loss_mask"].float()
        if self.info is None:
            self.info = [int(x) for x in batch["info"][0]]
        if not self.eval_cfgs["cloze_eval"]:
            nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
            nll_sum = (nll.view_as(mask) * mask).sum()
            return {"loss": nll_sum, "nll_sum": nll_sum, "targets": mask.sum()}
        hit = (logits.argmax(-1) == labels) | (mask == 0)
        correct = hit.all(dim=-1).sum()
        return {"loss": correct.float(), "num_correct": correct, "num_examples": labels.shape[0]}

    def validation_epoch_end(self, log_dict):
        sums = log_dict.get("sums") or {}
        path = self.eval_cfgs["eval_path"]
        if self.eval_cfgs["cloze_eval"]:
            correct, examples = sums.get("num_correct", 0.0), sums.get("num_examples", 0.0)
            acc = correct / examples if examples else float("nan")
            logger.info(
                "validation results on %s | number correct: %.4E | total examples: %.4E | "
                "avg accuracy: %.4E",
                path,
                correct,
                examples,
                acc,
            )
            return {"acc": acc, "num_correct": correct, "num_examples": examples}
        targets = sums.get("targets", 0.0)
        avg = sums.get("nll_sum", 0.0) / targets if targets else float("nan")
        original, tokenized = self.info or (targets + 1, targets + 1)
        ratio = (tokenized - 1) / max(original - 1, 1) if targets else float("nan")

        def capped_exp(x: float) -> float:  # FleetX's exp(min(20, x)); NaN stays NaN
            return x if math.isnan(x) else math.exp(min(20.0, x))

        out = {
            "avg_loss": avg,
            "ppl": capped_exp(avg),
            "adjusted_ppl": capped_exp(avg * ratio),
            "token_ratio": ratio,
        }
        logger.info(
            "validation results on %s | avg loss: %.4E | ppl: %.4E | adjusted ppl: %.4E | "
            "token ratio: %s",
            path,
            out["avg_loss"],
            out["ppl"],
            out["adjusted_ppl"],
            ratio,
        )
        return out
