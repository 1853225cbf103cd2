"""Export GPT-2, BERT / RoBERTa, T5 / mT5 or Llama / Qwen2 to ONNX and verify the graphs with
onnxruntime against PyTorch.

From a Hugging Face directory (config.json + safetensors)::

    python tools/export_onnx.py --model-path gpt2-hf --output out/model.onnx --with-past

From a libai training checkpoint (any training layout: a tp / pp checkpoint is gathered just
by loading it in this one process), with the config that built the model and overrides::

    python tools/export_onnx.py --model-path output/gpt2_pretrain \\
        --config-file configs/gpt2_pretrain.py --output out/model.onnx [model.cfg.x=y ...]

``--model-path`` is then a checkpoint directory or a training output directory (its
``last_checkpoint`` is used). Files written next to ``--output`` (``NAME.onnx``):

- GPT-2 / Llama / Qwen2: ``NAME.onnx`` (input_ids, attention_mask, position_ids -> logits;
  with ``--with-past`` also present.{i}.key/value) and, with ``--with-past``,
  ``NAME_with_past.onnx`` (also past_key_values.{i}.key/value inputs, for decode steps).
- BERT / RoBERTa: ``NAME.onnx`` (input_ids, attention_mask, token_type_ids -> the model's
  outputs, e.g. prediction_logits and seq_relationship_logits).
- T5 / mT5: ``encoder_NAME.onnx``, ``decoder_NAME.onnx`` and, with ``--with-past``,
  ``decoder_with_past_NAME.onnx`` (optimum's layout for NAME = model).

Every file is then run in onnxruntime on fresh random inputs of other batch and sequence
sizes than the export's (padded attention masks, single-token decode steps); the maximum
absolute difference to PyTorch is printed and the exit status is 1 above ``--atol``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

# the working directory first (the user's own modules and projects/<name> win), then this
# checkout (its libai, and its projects/ after the user's)
sys.path[:0] = [os.getcwd(), os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))]

from libai import dist  # noqa: E402
from libai.checkpoint.files import CheckpointError  # noqa: E402
from libai.onnx_export import (  # noqa: E402
    UnsupportedModelError,
    export_onnx,
    load_model,
    verify_onnx,
)

logger = logging.getLogger("libai.export_onnx")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--model-path",
        required=True,
        help="Hugging Face directory, or (with --config-file) a libai checkpoint / output dir",
    )
    parser.add_argument("--config-file", help="LazyConfig (.py or config.yaml) with `model`")
    parser.add_argument("--output", required=True, help="path of the main .onnx file")
    parser.add_argument(
        "--with-past", action="store_true", help="also export the key/value-cache graph(s)"
    )
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (torch's default)")
    parser.add_argument(
        "--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4, fp32)"
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=1e-4,
        help="tolerance relative to the largest |output| (default 1e-4): the check fails if\n"
        "max|onnxruntime - PyTorch| > atol + rtol * max|PyTorch output|",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides: key=value")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("libai").setLevel(logging.INFO)
    model = load_model(args.model_path, args.config_file, args.opts)
    start = time.perf_counter()
    specs = export_onnx(model, args.output, with_past=args.with_past, opset=args.opset)
    print(f"exported {type(model).__name__} in {time.perf_counter() - start:.1f}s:")
    for spec in specs:
        print(f"  {spec.path}  inputs {spec.input_names[:4]}{' ...' * (len(spec.input_names) > 4)}")
    if args.no_verify:
        return 0
    checks = verify_onnx(specs)
    failed = []
    for name, check in checks.items():
        limit = args.atol + args.rtol * check.max_abs_value
        print(
            f"onnxruntime vs PyTorch  {name}: max abs diff {check.max_abs_diff:.3e} "
            f"(max |output| {check.max_abs_value:.3g}, tolerance {limit:.3e})"
        )
        if not check.ok(args.atol, args.rtol):
            failed.append(name)
    if failed:
        print(f"error: {', '.join(failed)} differ(s) beyond the tolerance", file=sys.stderr)
        return 1
    print("ok: every graph matches PyTorch")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except (UnsupportedModelError, ValueError, FileNotFoundError, KeyError, CheckpointError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 2
    dist.destroy_dist()
    sys.exit(code)
