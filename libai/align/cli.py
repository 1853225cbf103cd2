"""Numerics alignment of two causal language models with :mod:`libai.align`: run both on the
same random tokens (forward, LM loss, backward), dump every module's outputs and input
gradients plus the parameters, and report the first module where they disagree.

    python tools/align.py --base hf:path/to/hf_gpt2 --raw libai:path/to/hf_gpt2
    python tools/align.py --base hf:path/to/hf_llama --raw libai:output/llama_sft
    python tools/align.py --base hf:path/to/hf_gpt2 --raw libai:configs/my_gpt.py
    torchrun --nproc_per_node 2 tools/align.py --base hf:DIR --raw libai:DIR --tp 2

A side is ``hf:DIR`` (a transformers model built from config.json's ``architectures``) or
``libai:X``: a Hugging Face directory loaded by libai's loaders, a trainer output directory
(``config.yaml`` + ``last_checkpoint``) or a checkpoint directory inside one, or a LazyConfig
``.py`` / ``.yaml`` file whose ``model`` is built and gets the other side's weights.
Supported: GPT-2, Llama and Qwen2 causal LMs, fp32, on CPU.

Exit status: 0 aligned, 1 a difference was found, 2 bad input (before any collective).
The dumps and the tree logs (``align_log/``) stay under ``--dump-root``; see docs/align.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass

from libai.align.auto_diff import PHASES
from libai.align.compare import COMPARE_MODES

#: config.json ``model_type`` -> the causal-LM architectures supported on each side
HF_CAUSAL_LMS = {
    "gpt2": ("GPT2LMHeadModel",),
    "llama": ("LlamaForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
}
SUPPORTED_TEXT = (
    "causal LMs only: GPT-2 (GPT2LMHeadModel / libai GPTForPreTraining), Llama "
    "(LlamaForCausalLM) and Qwen2 (Qwen2ForCausalLM)"
)
CONFIG_SUFFIXES = (".py", ".yaml", ".yml")


class UsageError(ValueError):
    """Bad command-line input: exit status 2."""


@dataclass
class Side:
    """One parsed ``--base`` / ``--raw`` spec."""

    flag: str  # "--base" or "--raw"
    spec: str  # as given
    kind: str  # "hf", "libai-hf", "libai-checkpoint" or "libai-config"
    path: str  # the directory, or the config file
    config_file: str | None = None  # libai-checkpoint: its config.yaml
    vocab_size: int | None = None  # from config.json / model.cfg, when known
    max_positions: int | None = None
    architecture: str | None = None  # config.json's transformers class (hf / libai-hf)

    @property
    def gets_weights(self) -> bool:
        """Whether this side's weights are copied from the other side (a bare config)."""
        return self.kind == "libai-config"


# ------------------------------------------------------------------------------ arguments


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    side_help = (
        "hf:DIR (transformers model dir) or libai:X (X = a Hugging Face dir, a trainer\n"
        "output / checkpoint dir, or a LazyConfig .py / .yaml file)"
    )
    parser.add_argument("--base", required=True, help="the reference model (side A): " + side_help)
    parser.add_argument("--raw", required=True, help="the model checked (side B): " + side_help)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (under torchrun)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel size (only 1 yet)")
    parser.add_argument("--batch", type=int, default=2, help="batch size of the random tokens")
    parser.add_argument("--seq", type=int, default=16, help="sequence length (>= 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tokens and of configs")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (to B)")
    parser.add_argument("--compare-mode", choices=COMPARE_MODES, default="strict")
    parser.add_argument(
        "--phase",
        choices=PHASES,
        default="both",
        help="forward: no backward is run; backward: report gradients only",
    )
    parser.add_argument(
        "--single-step",
        action="store_true",
        help="feed every raw module the base module's inputs / output gradients",
    )
    parser.add_argument(
        "--dump-root", default=None, help="an empty or new directory (default: a temporary one)"
    )
    return parser.parse_args(argv)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _read_json(path: str, flag: str, spec: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {spec}: cannot read {path}: {e}") from e


def _check_hf_config(side: Side, config: dict) -> None:
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    if model_type not in HF_CAUSAL_LMS:
        raise UsageError(
            f"{side.flag} {side.spec}: model_type {model_type!r} is not supported by "
            f"tools/align.py; supported: {SUPPORTED_TEXT}"
        )
    arch = archs[0] if archs else None
    if arch not in HF_CAUSAL_LMS[model_type]:
        raise UsageError(
            f"{side.flag} {side.spec}: architectures {archs} in config.json is not a causal LM "
            f"of model_type {model_type!r}; expected {list(HF_CAUSAL_LMS[model_type])} "
            f"({SUPPORTED_TEXT})"
        )
    side.architecture = arch
    side.vocab_size = config.get("vocab_size")
    side.max_positions = config.get("n_positions") or config.get("max_position_embeddings")


def _supported_libai_classes() -> tuple[type, ...]:
    from libai.models import GPTForPreTraining, LlamaForCausalLM

    return (GPTForPreTraining, LlamaForCausalLM)


def _check_libai_config(side: Side, config_file: str) -> None:
    """Load the LazyConfig (no model is built) and check its ``model``."""
    from libai.config import LazyConfig, locate, try_get_key

    try:
        cfg = LazyConfig.load(config_file)
    except Exception as e:  # a syntax or import error in the user's config
        raise UsageError(f"{side.flag} {side.spec}: cannot load {config_file}: {e}") from e
    if try_get_key(cfg, "model") is None:
        raise UsageError(f"{side.flag} {side.spec}: {config_file} defines no `model`")
    target = try_get_key(cfg, "model._target_")
    if isinstance(target, str):
        try:
            target = locate(target)
        except Exception as e:
            raise UsageError(f"{side.flag} {side.spec}: model._target_ {target!r}: {e}") from e
    if isinstance(target, type) and not issubclass(target, _supported_libai_classes()):
        raise UsageError(
            f"{side.flag} {side.spec}: the config's model is {target.__name__}; supported: "
            f"{SUPPORTED_TEXT}"
        )
    side.vocab_size = try_get_key(cfg, "model.cfg.vocab_size")
    side.max_positions = try_get_key(
        cfg, "model.cfg.max_seq_length", "model.cfg.max_position_embeddings"
    )


def parse_side(flag: str, spec: str) -> Side:
    """Check one ``--base`` / ``--raw`` spec without building anything."""
    prefix, sep, rest = spec.partition(":")
    if not sep or prefix not in ("hf", "libai") or not rest:
        raise UsageError(
            f"{flag} {spec!r}: expected hf:DIR (a transformers model directory) or libai:X "
            "(X = a Hugging Face directory, a libai trainer output or checkpoint directory, or "
            "a LazyConfig .py / .yaml file), e.g. --base hf:gpt2-hf --raw libai:gpt2-hf"
        )
    path = os.path.expanduser(rest)
    if not os.path.exists(path):
        raise UsageError(f"{flag} {spec}: {path} does not exist")
    hf_config = os.path.join(path, "config.json")
    if prefix == "hf":
        if not os.path.isfile(hf_config):
            raise UsageError(
                f"{flag} {spec}: {hf_config} not found: hf: takes a transformers model "
                "directory (config.json + weights); use libai:X for libai checkpoints and configs"
            )
        side = Side(flag, spec, "hf", path)
        _check_hf_config(side, _read_json(hf_config, flag, spec))
        _check_transformers_class(side)
        return side
    if os.path.isfile(path):
        if not path.endswith(CONFIG_SUFFIXES):
            raise UsageError(
                f"{flag} {spec}: libai: takes a directory or a LazyConfig file "
                f"({' / '.join(CONFIG_SUFFIXES)}), got {path}"
            )
        side = Side(flag, spec, "libai-config", path)
        _check_libai_config(side, path)
        return side
    if os.path.isfile(hf_config):
        side = Side(flag, spec, "libai-hf", path)
        _check_hf_config(side, _read_json(hf_config, flag, spec))
        return side
    return _checkpoint_side(flag, spec, path)


def _checkpoint_side(flag: str, spec: str, path: str) -> Side:
    """A trainer output dir (config.yaml + last_checkpoint) or a checkpoint dir in one."""
    from libai.checkpoint.locate import resolve_checkpoint

    candidates = [os.path.join(path, "config.yaml"), os.path.join(path, os.pardir, "config.yaml")]
    config_file = next((c for c in candidates if os.path.isfile(c)), None)
    try:
        checkpoint = resolve_checkpoint(path)
    except FileNotFoundError:
        checkpoint = None
    if config_file is None or checkpoint is None:
        raise UsageError(
            f"{flag} {spec}: {path} is not a Hugging Face directory (no config.json), nor a "
            "libai trainer output directory (config.yaml + last_checkpoint) or a checkpoint "
            "directory inside one (.metadata, config.yaml in its parent)"
        )
    side = Side(
        flag, spec, "libai-checkpoint", checkpoint, config_file=os.path.normpath(config_file)
    )
    _check_libai_config(side, side.config_file)
    return side


def _check_transformers_class(side: Side) -> None:
    import transformers

    if not hasattr(transformers, side.architecture):
        raise UsageError(
            f"{side.flag} {side.spec}: transformers {transformers.__version__} has no "
            f"{side.architecture}"
        )


def validate(args: argparse.Namespace) -> tuple[Side, Side]:
    """Every check that needs no process group; raises :class:`UsageError`."""
    for name in ("tp", "pp", "batch"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.seq < 2:
        raise UsageError(f"--seq must be >= 2 (the LM loss predicts token t+1), got {args.seq}")
    for name in ("atol", "rtol"):
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name} must be a number >= 0, got {getattr(args, name)}")
    if args.pp > 1:
        raise UsageError(
            f"--pp {args.pp}: pipeline parallel is not supported by tools/align.py yet; see "
            "docs/align.md (record the stages with ModelRunner in your own script and compare "
            "against a single-process dump)"
        )
    world = _world_size()
    if args.tp * args.pp != world:
        procs = args.tp * args.pp
        launch = (
            f"torchrun --nproc_per_node {procs} tools/align.py ..."
            if procs > 1
            else "python tools/align.py ... (without torchrun)"
        )
        raise UsageError(
            f"--tp {args.tp} --pp {args.pp} needs {procs} process(es) but WORLD_SIZE is "
            f"{world}: {launch}"
        )
    if args.dump_root is not None and os.path.exists(args.dump_root):
        if not os.path.isdir(args.dump_root) or os.listdir(args.dump_root):
            raise UsageError(
                f"--dump-root {args.dump_root} exists and is not an empty directory: pass a new "
                "or empty directory (or leave --dump-root out for a temporary one)"
            )
    base, raw = parse_side("--base", args.base), parse_side("--raw", args.raw)
    for side in (base, raw):
        if side.max_positions is not None and args.seq > int(side.max_positions):
            raise UsageError(
                f"--seq {args.seq} is longer than the {side.max_positions} positions of "
                f"{side.flag} {side.spec}; pass --seq {side.max_positions} or less"
            )
    return base, raw


# --------------------------------------------------------------------------------- models


def load_side(side: Side, seed: int):
    """Build one side's model (fp32, eval mode) on the current mesh."""
    import torch

    if side.kind == "hf":
        import transformers

        cls = getattr(transformers, side.architecture)
        model = cls.from_pretrained(side.path, dtype=torch.float32)
    elif side.kind == "libai-hf":
        from libai.models.utils import load_huggingface

        model = load_huggingface(side.path)
    else:
        from libai.config import LazyConfig, instantiate

        config_file = side.config_file or side.path
        cfg = LazyConfig.load(config_file)
        torch.manual_seed(seed)  # the full weights depend on the seed only, not the layout
        model = instantiate(cfg.model)
        if side.kind == "libai-checkpoint":
            model = _load_checkpoint(model, cfg, side.path)
    if side.kind != "hf" and not isinstance(model, _supported_libai_classes()):
        raise UsageError(
            f"{side.flag} {side.spec}: built a {type(model).__name__}; supported: {SUPPORTED_TEXT}"
        )
    return model.float().eval()


def _load_checkpoint(model, cfg, checkpoint: str):
    """Load a trainer checkpoint (any training layout) into ``model`` on this mesh, as
    :func:`libai.onnx_export.loading.load_checkpoint_model` does in one process (the vocab
    size the trainer padded and saved after config.yaml)."""
    from libai.checkpoint.checkpointer import Checkpointer
    from libai.checkpoint.locate import checkpoint_vocab_size
    from libai.config import instantiate, try_get_key

    vocab = try_get_key(cfg, "model.cfg.vocab_size")
    if vocab is not None:
        trained = checkpoint_vocab_size(model, checkpoint, vocab)
        if trained is not None:
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"note: vocab_size {trained} in the checkpoint (config.yaml says {vocab})")
            cfg.model.cfg.vocab_size = trained
            model = instantiate(cfg.model)
    Checkpointer(model).load(checkpoint, checkpointables=[])
    return model


def vocab_size(model) -> int:
    """The (unpadded) vocabulary of a transformers or libai causal LM."""
    from libai.align.layouts import model_vocab_size

    config = getattr(model, "config", None)
    if config is not None and getattr(config, "vocab_size", None):
        return int(config.vocab_size)
    size = model_vocab_size(model)
    if size is None:
        raise UsageError(f"cannot tell the vocabulary size of {type(model).__name__}")
    return size


def lm_loss(input_ids):
    """Loss function on a model output: the causal-LM cross-entropy of its logits
    (``output["logits"]``: transformers' ``ModelOutput`` and libai's dict alike)."""
    import torch.nn.functional as F

    targets = input_ids[:, 1:].reshape(-1)

    def loss(output):
        logits = output["logits"]
        return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets)

    return loss


# ----------------------------------------------------------------------------------- main


def _quiet_libraries() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(Exception):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


def _dump_root(args) -> str:
    """``--dump-root`` or a new temporary directory, the same on every rank."""
    from libai import dist

    root = args.dump_root
    if root is None:
        root = tempfile.mkdtemp(prefix="libai_align_") if dist.get_rank() == 0 else None
        root = dist.broadcast_py_object(root, src=0)
    os.makedirs(root, exist_ok=True)
    return os.path.abspath(root)


def run(args, base_side: Side, raw_side: Side) -> int:
    """Set up the mesh, build both models, record, dump and compare; the exit status."""
    import torch
    import torch.distributed as torch_dist

    from libai import dist
    from libai.align import assign_weight, auto_diff, check_weights

    dist.setup_dist_util(
        {"data_parallel_size": 1, "tensor_parallel_size": args.tp, "pipeline_parallel_size": 1}
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    root = _dump_root(args)
    try:
        base = load_side(base_side, args.seed)
        raw = load_side(raw_side, args.seed)
        if raw_side.gets_weights:
            assign_weight(base, raw)
        elif base_side.gets_weights:
            assign_weight(raw, base)
        vocab = min(vocab_size(base), vocab_size(raw))
    except (ValueError, OSError, KeyError, RuntimeError) as e:  # CheckpointError, UsageError too
        print(f"error: loading the models failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    inputs = {"input_ids": input_ids}
    # each rank records, dumps and checks its own rank dirs: no rank reads another's files
    rank_root = root if world == 1 else os.path.join(root, f"rank_{rank}")
    out = None if rank == 0 else open(os.path.join(root, f"report_rank_{rank}.txt"), "w")
    with out or contextlib.nullcontext(), contextlib.redirect_stdout(out or sys.stdout):
        if rank == 0:
            print(
                f"align: A = {base_side.spec} ({type(base).__name__}), "
                f"B = {raw_side.spec} ({type(raw).__name__}); input_ids [{args.batch}, "
                f"{args.seq}] of vocab {vocab}, seed {args.seed}, tp {args.tp}"
            )
        try:
            ok = auto_diff(
                base,
                raw,
                (inputs, inputs),
                loss_fns=(lm_loss(input_ids), lm_loss(input_ids)),
                atol=args.atol,
                rtol=args.rtol,
                auto_init=False,
                compare_mode=args.compare_mode,
                diff_phase=args.phase,
                single_step=args.single_step,
                dump_root=rank_root,
            )
            cfg = {"atol": args.atol, "rtol": args.rtol, "compare_mode": args.compare_mode}
            cfg["log_dir"] = os.path.join(rank_root, "align_log")
            paths = (os.path.join(rank_root, "base"), os.path.join(rank_root, "raw"))
            ok = check_weights(*paths, cfg) and ok
        except (ValueError, FileNotFoundError) as e:  # dumps that cannot be compared
            print(f"error: the dumps cannot be compared: {e}")
            ok = False
    if world > 1:
        flag = torch.tensor([int(ok)])
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN)
        ok = bool(flag.item())
    if rank == 0:
        where = (
            root if world == 1 else f"{root}/rank_<r> (other ranks' output: report_rank_<r>.txt)"
        )
        print(f"align: {'PASS' if ok else 'FAIL'}; dumps and logs in {where}")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        base_side, raw_side = validate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    _quiet_libraries()
    return run(args, base_side, raw_side)
