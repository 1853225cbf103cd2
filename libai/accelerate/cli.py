"""The black box: ``libai-accelerate`` (or ``python tools/libai_accelerate.py``) trains an
unmodified Hugging Face model on local data for a task, with the acceleration switches of
the flags, and writes the result back as a Hugging Face directory (``--save``/hf).

It is the built-in template :class:`TaskFinetuner`, whose providers come from the task
(:mod:`libai.accelerate.tasks`) and the model directory; ``--user-script FILE`` runs your own
template instead. Everything that can fail on bad input (paths, columns, flags, layout) is
checked before the mesh is created.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from libai import dist
from libai.accelerate.arguments import check_black_box_args, parse_args
from libai.accelerate.data import pretraining_datasets
from libai.accelerate.engine import AccelerateEngine
from libai.accelerate.hub_data import train_and_eval_splits
from libai.accelerate.models import (
    HFTaskModel,
    build_model,
    check_layout,
    hf_pretraining_batch,
    model_type_of,
    save_pretrained,
    zoo_batch,
)
from libai.accelerate.pretraining import (
    bert_black_box_datasets,
    build_pretraining_model,
    from_megatron_flags,
    pretraining_family,
    pretraining_tokenizer,
)
from libai.accelerate.tasks import get_task
from libai.accelerate.templates import Finetuner
from libai.accelerate.user_script import run_user_script, user_script_of
from libai.dist.cli import run_cli
from libai.models.contract import total_loss
from libai.runtime.evaluate import evaluate as run_evaluation
from libai.runtime.evaluate import sum_over_ranks

logger = logging.getLogger(__name__)

__all__ = ["TaskFinetuner", "main"]

#: model types whose tokenizers are byte-level BPE (words need a prefix space)
BYTE_LEVEL_MODELS = (
    "roberta",
    "gpt2",
    "llama",
    "qwen2",
    "qwen3",
    "bart",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
)


class TaskFinetuner(Finetuner):
    """The black box's template: ``--task``'s data, model, loss and metric."""

    def __init__(self, engine, prepared, tokenizer, is_pretraining=False, family=None):
        super().__init__(engine)
        self.task = get_task(engine.args.task)
        self.prepared, self.tokenizer = prepared, tokenizer
        self.is_pretraining = is_pretraining
        #: pretraining a transformers model of this family (``"bert"`` / ``"gpt"``) built by
        #: :func:`build_pretraining_model`; ``None``: :func:`build_model`'s model
        self.family = family
        self.is_zoo = False

    def train_valid_test_datasets_provider(self):
        return self.prepared.train, self.prepared.valid

    def model_optimizer_lr_scheduler_provider(self):
        if self.family is not None:
            hf = build_pretraining_model(self.args, self.family, self.tokenizer)
            return HFTaskModel(hf.to(self.engine.util.device)), None, None
        model, self.is_zoo = build_model(
            self.task.name, self.args, self.task.auto_model, self.prepared.model_kwargs
        )
        return model, None, None

    def batch_transform(self, batch):
        if self.is_zoo:
            return zoo_batch(self.engine.runner.model, batch, self.task.name)
        if self.family == "bert":  # BertPretrainingSamples: transformers' names already
            return batch
        return hf_pretraining_batch(batch) if self.is_pretraining else batch

    def run_compute_metrics(self, model, eval_dataloader) -> dict:
        sums: dict = {}

        def step(batch):
            outputs = dict(model(**self.batch_transform(batch)))
            outputs["loss"] = total_loss(outputs)
            self.task.update(sums, batch, outputs)
            return outputs["loss"]

        run_evaluation(self.engine.runner, eval_dataloader, step=step)
        keys = sorted(sums)  # the same keys on every rank
        totals = sum_over_ranks([float(sums[k]) for k in keys], self.engine.util.device)
        return self.task.compute(dict(zip(keys, totals)))

    def pipeline_metrics(self, run) -> dict:
        results = super().pipeline_metrics(run)
        if "perplexity" in self.task.metrics:
            results["perplexity"] = float(torch.tensor(run.loss).exp())
        return results


def _tokenizer(args, model_type):
    """The model directory's tokenizer; byte-level BPE ones with a prefix space for words
    given one by one (token classification)."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs = {}
    if args.task == "token_classification" and model_type in BYTE_LEVEL_MODELS:
        kwargs["add_prefix_space"] = True
    return AutoTokenizer.from_pretrained(
        args.pretrained_model_name_or_path, local_files_only=True, **kwargs
    )


class _Prepared:
    def __init__(self, train, valid, model_kwargs=None):
        self.train, self.valid, self.model_kwargs = train, valid, model_kwargs or {}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script = user_script_of(argv)
    if script:  # the script is the run (its flags may include its own: extra_args_provider)
        run_user_script(script, argv)
        return 0
    args = parse_args(argv)
    check_black_box_args(args)
    task = get_task(args.task)
    model_type = model_type_of(args.pretrained_model_name_or_path)
    family = None
    if task.name == "pretraining":
        family = pretraining_family(args, model_type)
        if family == "gpt" and not from_megatron_flags(args):
            family = None  # the model directory's causal LM (the zoo's GPT-2 on any layout)
        model_type = None if family is not None else model_type
    check_layout(
        task.name,
        model_type,
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.expert_model_parallel_size,
    )
    if task.name == "pretraining" and (family is not None or args.tokenizer_type):
        tokenizer = pretraining_tokenizer(args)
    else:
        tokenizer = _tokenizer(args, model_type)
    if task.name == "pretraining":
        prepared = None  # built on the mesh: the sample counts need the step count
    else:  # data, columns and tokenization before any collective
        train, valid = train_and_eval_splits(args.data_path, args.data_name, args.validation_path)
        prepared = task.prepare(train, valid, tokenizer, args)
    engine = AccelerateEngine(args)
    if prepared is None:
        steps = args.train_iters
        if not steps:
            raise ValueError("--task pretraining needs --train-iters")
        evals = (steps // (args.eval_interval or steps) + 1) * (args.eval_iters or 1)
        samples = [steps * args.global_batch_size, evals * args.global_batch_size]
        if family == "bert":
            train, valid = bert_black_box_datasets(args, tokenizer, samples)
        else:
            train, valid = pretraining_datasets(args, samples)
        prepared = _Prepared(train, valid)
    runner_model = TaskFinetuner(engine, prepared, tokenizer, task.name == "pretraining", family)
    model = runner_model.train()
    out = os.path.join(args.save, "hf")
    lora = engine.train_cfg.lora.config()
    save_pretrained(
        model,
        out,
        tokenizer,
        lora=lora,
        merge=args.merge_lora,
        base=args.pretrained_model_name_or_path,
    )
    if dist.is_main_process():
        if lora is not None and not args.merge_lora:
            logger.info("LoRA adapter written to %s (peft.PeftModel.from_pretrained loads it)", out)
        else:
            logger.info("Trained model written to %s (transformers' from_pretrained loads it)", out)
    return 0


def console_main() -> None:
    """Entry point of the ``libai-accelerate`` console script."""
    sys.path.insert(0, os.getcwd())
    run_cli(main)
