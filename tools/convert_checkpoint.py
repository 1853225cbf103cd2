"""Convert between libai checkpoints and Hugging Face model directories.

Hugging Face -> libai (a checkpoint ``tools/train_net.py`` loads with ``train.load_weight``)::

    python tools/convert_checkpoint.py from-hf --hf-dir llama-hf --output ckpt [--name model_hf]

writes ``ckpt/model_hf`` (sharded DCP, loadable on any layout) and ``ckpt/libai_model.json``
(the libai class and hyper-parameters, to copy into a config's ``model``).

libai -> Hugging Face::

    python tools/convert_checkpoint.py to-hf --checkpoint output/model_final \\
        --config-file output/config.yaml --output llama-hf

``--config-file`` is the training ``config.yaml`` (its ``model`` entry is built); without it
``libai_model.json`` next to the checkpoint is used.

A LoRA run (``train.lora`` in its config.yaml): ``to-peft`` writes the adapters as a PEFT
adapter directory (``peft.PeftModel.from_pretrained`` loads it onto the base), ``to-hf
--merge-lora`` the base with the adapters folded in::

    python tools/convert_checkpoint.py to-peft --checkpoint output/model_final \
        --config-file output/config.yaml --output lora-adapter [--base-model /models/base]
 Both directions run on one process, or
under ``torchrun`` on a dp x tp layout (``--tp``), where every rank handles only its shards.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys

# the working directory first (the user's own modules and projects/<name> win), then this
# checkout (its libai, and its projects/ after the user's)
sys.path[:0] = [os.getcwd(), os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))]

from libai import dist  # noqa: E402
from libai.checkpoint.checkpointer import Checkpointer  # noqa: E402
from libai.dist.cli import run_cli  # noqa: E402
from libai.models.utils import load_huggingface, save_huggingface  # noqa: E402
from libai.models.utils.hf_export import model_libai_cfg  # noqa: E402

logger = logging.getLogger("libai.convert_checkpoint")
MODEL_JSON = "libai_model.json"


def _json_safe(cfg: dict) -> dict:
    out = {}
    for key, value in cfg.items():
        try:
            json.dumps(value)
        except TypeError:
            continue  # e.g. an init function: the class default applies
        out[key] = value
    return out


def from_hf(args) -> None:
    dist.setup_dist_util({"tensor_parallel_size": args.tp})
    model = load_huggingface(args.hf_dir)
    Checkpointer(model, args.output).save(args.name)
    if dist.is_main_process():
        cls = type(model)
        spec = {
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "cfg": _json_safe(model_libai_cfg(model)),
        }
        with open(os.path.join(args.output, MODEL_JSON), "w", encoding="utf-8") as f:
            json.dump(spec, f, indent=2)
        print(f"wrote {os.path.join(args.output, args.name)} and {MODEL_JSON}")


def _lora_config(args):
    """The run's LoRA settings (None: not a LoRA run, or no config file)."""
    if not args.config_file:
        return None
    from libai.config import LazyConfig
    from libai.runtime.spec import as_spec_lora

    return as_spec_lora(LazyConfig.load(args.config_file))


def _build_model(args):
    if args.config_file:
        from libai.config import LazyConfig, instantiate

        cfg = LazyConfig.load(args.config_file)
        return instantiate(cfg.model)
    spec_file = os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), MODEL_JSON)
    if not os.path.isfile(spec_file):
        raise SystemExit(
            f"no --config-file given and no {MODEL_JSON} next to {args.checkpoint}: pass the "
            "training config.yaml with --config-file"
        )
    with open(spec_file, encoding="utf-8") as f:
        spec = json.load(f)
    module, name = spec["class"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(cfg=spec["cfg"])


def _load(args):
    """The model of ``args.checkpoint`` (with its LoRA adapters in a LoRA run)."""
    from libai.models.lora import apply_lora

    dist.setup_dist_util({"tensor_parallel_size": args.tp})
    model = _build_model(args)
    lora = _lora_config(args)
    if lora is not None:
        apply_lora(model, lora)
    Checkpointer(model).load(args.checkpoint, checkpointables=[])
    return model, lora


def to_hf(args) -> None:
    from libai.models.lora import merge_lora

    model, lora = _load(args)
    if lora is not None and not args.merge_lora:
        raise SystemExit(
            f"{args.checkpoint} holds LoRA adapters: pass --merge-lora to export the merged "
            "model, or use to-peft for the adapter alone"
        )
    if lora is not None:
        merge_lora(model)
    save_huggingface(model, args.output, max_shard_size=args.max_shard_size)
    if dist.is_main_process():
        print(f"wrote Hugging Face directory {args.output}")


def to_peft(args) -> None:
    from libai.checkpoint.lora_base import weights_source
    from libai.models.lora_peft import save_peft_adapter

    model, lora = _load(args)
    if lora is None:
        raise SystemExit(
            f"{args.config_file or 'no --config-file'}: not a LoRA run (train.lora.target_modules "
            "is empty); to-peft exports adapters"
        )
    source = weights_source(model)
    base = args.base_model or (
        source["path"] if source and source["kind"] == "huggingface" else None
    )
    save_peft_adapter(model, lora, args.output, base)
    if dist.is_main_process():
        print(f"wrote PEFT adapter directory {args.output}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("from-hf", help="Hugging Face directory -> libai checkpoint")
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--output", required=True, help="checkpoint directory (save_dir)")
    p.add_argument("--name", default="model_hf", help="checkpoint name inside --output")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (under torchrun)")
    p.set_defaults(run=from_hf)
    p = sub.add_parser("to-hf", help="libai checkpoint -> Hugging Face directory")
    p.add_argument("--checkpoint", required=True, help="e.g. output/model_final")
    p.add_argument("--config-file", default=None, help="the run's config.yaml")
    p.add_argument("--output", required=True)
    p.add_argument("--max-shard-size", type=int, default=5 * 2**30, help="bytes per shard")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (under torchrun)")
    p.add_argument("--merge-lora", action="store_true", help="fold a LoRA run's adapters in")
    p.set_defaults(run=to_hf)
    p = sub.add_parser("to-peft", help="a LoRA run's adapters -> PEFT adapter directory")
    p.add_argument("--checkpoint", required=True, help="e.g. output/model_final")
    p.add_argument("--config-file", required=True, help="the run's config.yaml")
    p.add_argument("--output", required=True)
    p.add_argument(
        "--base-model",
        default=None,
        help="recorded as base_model_name_or_path (default: the Hugging Face "
        "directory the run's base was read from)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (under torchrun)")
    p.set_defaults(run=to_peft)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    args.run(args)
    return 0


if __name__ == "__main__":
    run_cli(main)  # bad input (a missing, corrupt or unsafe checkpoint): one line, exit 1
