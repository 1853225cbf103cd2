"""Rapidformer's command line: flag names, checks, and the translation into the core's
``train`` namespace (:mod:`libai.runtime.core` builds the runner, hooks and writers from it).

Everything that can be checked without a collective is checked here, before the mesh exists:
the task, paths (a model's Hub id is resolved to its snapshot in the Hugging Face cache;
nothing is downloaded unless ``HF_HUB_OFFLINE=0``), batch arithmetic against the process count,
the layout against the model's architecture, and contradicting switches.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex

from libai.accelerate.megatron_args import add_megatron_names, set_megatron_names
from libai.accelerate.pretraining import add_megatron_model_flags, check_pretraining_args
from libai.accelerate.tasks import TASKS
from libai.config.resolve import BatchNames, batch_sizes
from libai.layers.float8 import FP8_RECIPES
from libai.runtime.spec import (
    ActivationCheckpointSpec,
    AmpSpec,
    CheckpointerSpec,
    EvaluationSpec,
    LoRASpec,
    RunSpec,
    ZeroSpec,
)

logger = logging.getLogger(__name__)

#: the flags of the batch sizes (the accumulation steps are always derived)
FLAGS = BatchNames("--micro-batch-size", "--global-batch-size", None, sep=" ")

__all__ = [
    "build_parser",
    "check_args",
    "check_black_box_args",
    "parse_args",
    "train_namespace",
    "world_size",
]

DECAY_STYLES = ("constant", "linear", "cosine")
ZERO_FLAGS = {
    "zero_1_memory_optimization": 1,
    "zero_2_memory_optimization": 2,
    "zero_3_memory_optimization": 3,
    "fsdp_memory_optimization": 3,
}


def build_parser(prog: str = "libai-accelerate") -> argparse.ArgumentParser:
    """The flags (Rapidformer's names; ``--help`` lists them by group)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train an unmodified Hugging Face model with libai's acceleration switches.",
        epilog="Example: bash tools/train.sh tools/libai_accelerate.py - 2 --task "
        "sequence_classification --pretrained-model-name-or-path DIR --data-path train.csv "
        "--validation-path dev.csv --text-columns sentence1,sentence2 --label-column label "
        "--epochs 3 --micro-batch-size 16 --global-batch-size 64 --mixed-precision",
    )
    p.add_argument("--config-file", default="-", help="a file of more flags ('-': none)")
    p.add_argument("--user-script", help="a Python file defining a Finetuner / PreTrainer subclass")
    g = p.add_argument_group("task and data")
    g.add_argument("--task", choices=sorted(TASKS))
    g.add_argument(
        "--pretrained-model-name-or-path",
        help="a Hugging Face model directory, or a Hub id (from the Hugging Face cache)",
    )
    g.add_argument(
        "--data-path",
        help="datasets.load_dataset's path: a Hub id, a dataset repository or save_to_disk "
        "directory, or a CSV / JSON lines / parquet file; pretraining: a .bin/.idx prefix",
    )
    g.add_argument("--data-name", default=None, help="the dataset's configuration (GLUE: mrpc)")
    g.add_argument("--validation-path", help="evaluation data (same formats)")
    g.add_argument("--data-impl", default="mmap", choices=["mmap"], help="pretraining data")
    g.add_argument("--split", default="980,20", help="pretraining train,valid[,test] split")
    g.add_argument(
        "--text-columns",
        default=None,
        help="comma-separated, 1 or 2 columns (default: GLUE / SuperGLUE's, inferred)",
    )
    g.add_argument("--text-column", default="text", help="masked_lm / causal_lm")
    g.add_argument("--label-column", default=None, help="default: label (ner_tags for tokens)")
    g.add_argument("--tokens-column", default="tokens")
    g.add_argument("--question-column", default="question")
    g.add_argument("--context-column", default="context")
    g.add_argument("--answers-column", default="answers")
    g.add_argument("--source-column", default="source")
    g.add_argument("--target-column", default="target")
    g.add_argument("--target-length", type=int, default=None)
    g.add_argument("--seq-length", type=int, default=128)
    g.add_argument("--mlm-probability", type=float, default=0.15)
    g.add_argument("--num-workers", type=int, default=0)
    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=8, help="per data-parallel rank")
    g.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="default: micro x data parallel; more = gradient accumulation",
    )
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=DECAY_STYLES, default="linear")
    g.add_argument("--lr-decay-iters", type=int, default=None, help="default: the train iters")
    g.add_argument("--lr-warmup-iters", type=int, default=None)
    g.add_argument("--lr-warmup-fraction", type=float, default=None)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0, help="global-norm clipping; 0: off")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=None, help="default: once at the end")
    g.add_argument("--eval-iters", type=int, default=0, help="batches per evaluation; 0: all")
    g.add_argument("--save", default="output/accelerate", help="output and checkpoint directory")
    g.add_argument("--save-interval", type=int, default=None, help="default: only at the end")
    g.add_argument(
        "--load",
        default=None,
        help="a checkpoint directory to resume, or a Hugging Face model directory to start from",
    )
    g = p.add_argument_group("parallelism and acceleration")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument(
        "--context-parallel-size",
        type=int,
        default=1,
        help="Megatron's name; 1 here: context parallel runs inside libai's attention layers "
        "(the LiBai and FleetX doors' GPT-2 and Llama), not a Hugging Face model's",
    )
    g.add_argument(
        "--expert-model-parallel-size",
        type=int,
        default=1,
        help="Megatron's name: the experts of a Mixture-of-Experts model (Mixtral, "
        "Qwen2-MoE) split over this many data-parallel ranks",
    )
    g.add_argument(
        "--moe-aux-loss-coeff",
        type=float,
        default=None,
        help="Megatron's name: the weight of the load-balancing loss of every MoE layer "
        "(default: the checkpoint's, router_aux_loss_coef when output_router_logits)",
    )
    g.add_argument("--pipeline-schedule", default="1F1B")
    g = p.add_argument_group("LoRA (PEFT's settings; a zoo model's layers, the base frozen)")
    g.add_argument("--lora-r", type=int, default=None, help="the rank; turns LoRA on")
    g.add_argument("--lora-alpha", type=float, default=None, help="default: 2 x r")
    g.add_argument("--lora-dropout", type=float, default=0.0)
    g.add_argument(
        "--lora-target-modules",
        default=None,
        help="comma-separated layer names, PEFT's (q_proj,v_proj) or libai's "
        "(query_key_value,dense); default: q_proj,v_proj",
    )
    g.add_argument("--use-rslora", action="store_true", help="scale by alpha / sqrt(r)")
    g.add_argument(
        "--merge-lora",
        action="store_true",
        help="write the merged model at the end instead of the PEFT adapter directory",
    )
    g.add_argument(
        "--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available"
    )
    g.add_argument("--mixed-precision", action="store_true", help="torch.autocast")
    g.add_argument(
        "--mixed-precision-dtype",
        choices=["bf16", "fp16"],
        default="bf16",
        help="fp16 adds a dynamic loss scaler",
    )
    g.add_argument(
        "--fp8",
        choices=list(FP8_RECIPES),
        default=None,
        help="float8 matmuls in the large Linear layers (torchao's recipe; pip install "
        "'libai[fp8]'); the lm_head stays in high precision",
    )
    g.add_argument(
        "--zero-1-memory-optimization",
        action="store_true",
        help="shard optimizer states over data-parallel ranks",
    )
    g.add_argument("--zero-2-memory-optimization", action="store_true", help="also shard gradients")
    g.add_argument(
        "--zero-3-memory-optimization",
        action="store_true",
        help="also shard parameters (FSDP2 fully_shard)",
    )
    g.add_argument(
        "--fsdp-memory-optimization",
        action="store_true",
        help="FSDP2 fully_shard: the same switch as --zero-3-memory-optimization",
    )
    g.add_argument(
        "--checkpoint-activations", action="store_true", help="recompute each block in backward"
    )
    g.add_argument(
        "--recompute-granularity",
        choices=["full", "selective"],
        default="full",
        help="with --checkpoint-activations: recompute everything, or keep the matmul and "
        "attention outputs (selective)",
    )
    g.add_argument("--graph-optimization", action="store_true", help="torch.compile each block")
    g.add_argument(
        "--onnx-runtime-training",
        action="store_true",
        help="alias of --graph-optimization: torch.compile, no ONNX Runtime training here",
    )
    add_megatron_model_flags(p)
    add_megatron_names(p)
    return p


def _expand_config_file(argv: list[str]) -> list[str]:
    """``--config-file FILE`` adds the flags written in FILE before the command line's."""
    if "--config-file" not in argv:
        return argv
    i = argv.index("--config-file")
    path = argv[i + 1] if i + 1 < len(argv) else "-"
    rest = argv[:i] + argv[i + 2 :]
    if path == "-":
        return rest
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config-file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        return shlex.split(f.read(), comments=True) + rest


def parse_args(argv: list[str] | None = None, parser=None) -> argparse.Namespace:
    """Parse and check ``argv`` (see :func:`check_args`)."""
    import sys

    parser = parser or build_parser()
    argv = _expand_config_file(list(sys.argv[1:] if argv is None else argv))
    return check_args(parser.parse_args(argv))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def _local_path(value: str | None, flag: str) -> None:
    """``value`` must be a local file or directory (or a Megatron .bin/.idx prefix)."""
    if value is None:
        return
    if not os.path.exists(value) and not os.path.isfile(value + ".idx"):
        raise FileNotFoundError(
            f"{flag} {value!r} is not a local file or directory. Nothing is downloaded: pass a "
            "local path (a Hugging Face model directory; data as CSV, JSON lines, parquet or a "
            "datasets.save_to_disk directory)"
        )


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Checks without any collective (same result on every rank), and derived values:
    ``data_parallel_size``, ``global_batch_size``, ``num_accumulation_steps``,
    ``zero_stage``, ``text_columns`` as a list, ``device``."""
    from libai.accelerate.hub_data import offline_by_default, resolve_model_dir

    offline_by_default()
    if args.onnx_runtime_training:
        logger.warning(
            "--onnx-runtime-training: compiles each block with torch.compile (the alias of "
            "--graph-optimization; no ONNX Runtime training here)%s",
            "; on CPU the first, cold compile takes longer than a short run saves"
            if (args.device or ("cuda" if _cuda() else "cpu")) == "cpu"
            else "",
        )
        args.graph_optimization = True
    _local_path(args.user_script, "--user-script")
    if args.task is not None and args.user_script is None:
        if args.task == "pretraining":
            check_pretraining_args(args)
        elif not args.pretrained_model_name_or_path:
            raise ValueError(f"--task {args.task} needs --pretrained-model-name-or-path DIR")
        if not args.data_path:
            raise ValueError(f"--task {args.task} needs --data-path")
    if args.pretrained_model_name_or_path:
        args.pretrained_model_name_or_path = resolve_model_dir(args.pretrained_model_name_or_path)
    if args.task == "pretraining":
        if args.data_path and not os.path.isfile(args.data_path + ".idx"):
            raise FileNotFoundError(
                f"--data-path {args.data_path!r}: no {args.data_path}.idx (pretraining reads the "
                ".bin/.idx pair written by tools/preprocess_data.py; give its prefix)"
            )
    _local_path(args.validation_path, "--validation-path")
    _local_path(args.load, "--load")
    if args.text_columns is not None:
        args.text_columns = [c.strip() for c in str(args.text_columns).split(",") if c.strip()]
        if not 1 <= len(args.text_columns) <= 2:
            raise ValueError(f"--text-columns takes 1 or 2 columns, got {args.text_columns}")
    if args.label_column is None:
        args.label_column = "ner_tags" if args.task == "token_classification" else "label"
    zero = [name for name in ZERO_FLAGS if getattr(args, name)]
    if len(zero) > 1:
        flags = ", ".join("--" + z.replace("_", "-") for z in zero)
        raise ValueError(f"{flags} contradict each other: choose one memory optimization")
    args.zero_stage = ZERO_FLAGS[zero[0]] if zero else None
    if args.lr_warmup_iters is not None and args.lr_warmup_fraction is not None:
        raise ValueError("give --lr-warmup-iters or --lr-warmup-fraction, not both")
    for flag in (
        "micro_batch_size",
        "seq_length",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.context_parallel_size > 1:
        raise ValueError(
            f"--context-parallel-size {args.context_parallel_size}: context parallel splits "
            "each sequence inside libai's attention layers (GPT-2 and Llama/Qwen2 through "
            "tools/train_net.py or FleetX's Engine); the Hugging Face models this door trains "
            "run their own attention. Use --context-parallel-size 1"
        )
    lora_flags = [f for f in ("lora_alpha", "lora_target_modules") if getattr(args, f) is not None]
    if args.lora_r is None and (lora_flags or args.merge_lora or args.use_rslora):
        named = lora_flags + [f for f in ("merge_lora", "use_rslora") if getattr(args, f)]
        raise ValueError(f"--{named[0].replace('_', '-')} needs --lora-r (the rank turns LoRA on)")
    if args.moe_aux_loss_coeff is not None and args.moe_aux_loss_coeff < 0:
        raise ValueError(f"--moe-aux-loss-coeff must be >= 0, got {args.moe_aux_loss_coeff}")
    tp, pp, world = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, world_size()
    if world % (tp * pp):
        raise ValueError(
            f"{world} processes are not divisible by --tensor-model-parallel-size {tp} x "
            f"--pipeline-model-parallel-size {pp}; launch a multiple of {tp * pp}"
        )
    dp = world // (tp * pp)
    sizes = batch_sizes(args.micro_batch_size, args.global_batch_size or None, None, dp, FLAGS)
    args.data_parallel_size = dp
    args.global_batch_size, args.num_accumulation_steps = sizes[1:]
    if args.zero_stage is not None and dp < 2:  # as DeepSpeed: nothing to shard over
        logger.warning(
            "--%s: one data-parallel rank, nothing to shard over; running without ZeRO",
            zero[0].replace("_", "-"),
        )
        args.zero_stage = None
    if args.device is None:
        args.device = "cuda" if _cuda() else "cpu"
    return set_megatron_names(args)


def check_black_box_args(args: argparse.Namespace) -> None:
    """What the black box (``--task``) needs beyond :func:`check_args`: an engine for
    templates or compose needs neither a task nor a run length."""
    if args.task is None:
        raise ValueError(
            "--task is required (or --user-script); tasks: " + ", ".join(sorted(TASKS))
        )
    if args.train_iters is None and args.epochs is None:
        raise ValueError("give --train-iters or --epochs")


def train_namespace(args, *, train_iter: int, dist_cfg: dict) -> RunSpec:
    """The run spec (:class:`~libai.runtime.spec.RunSpec`) of ``args``."""
    never = train_iter + 1
    return RunSpec.from_config(
        dict(
            output_dir=args.save,
            train_iter=int(train_iter),
            train_micro_batch_size=args.micro_batch_size,
            global_batch_size=args.global_batch_size,
            num_accumulation_steps=args.num_accumulation_steps,
            log_period=args.log_interval,
            seed=args.seed,
            amp=AmpSpec(
                enabled=bool(args.mixed_precision), dtype=args.mixed_precision_dtype, fp8=args.fp8
            ),
            activation_checkpoint=ActivationCheckpointSpec(
                enabled=bool(args.checkpoint_activations), mode=args.recompute_granularity
            ),
            zero_optimization=ZeroSpec(
                enabled=args.zero_stage is not None, stage=args.zero_stage or 1
            ),
            checkpointer=CheckpointerSpec(
                period=int(args.save_interval or never), max_to_keep=None
            ),
            evaluation=EvaluationSpec(
                enabled=True,
                eval_period=int(args.eval_interval or never),
                eval_iter=args.eval_iters,
                eval_metric=None,
                eval_mode="max",
            ),
            dist=dist_cfg,
            lora=lora_spec(args),
        )
    )


def lora_spec(args) -> LoRASpec:
    """``train.lora`` of the ``--lora-*`` flags (off without ``--lora-r``)."""
    r = getattr(args, "lora_r", None)  # (a namespace of another parser has no LoRA flags)
    if r is None:
        return LoRASpec()
    targets = args.lora_target_modules or "q_proj,v_proj"
    return LoRASpec(
        target_modules=[t.strip() for t in targets.split(",") if t.strip()],
        r=r,
        lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2.0 * r,
        lora_dropout=args.lora_dropout,
        use_rslora=args.use_rslora,
    )
