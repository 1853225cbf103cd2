"""Tokenize a JSON-lines corpus into Megatron ``.bin`` / ``.idx`` files for pretraining.

Example::

    python tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --tokenizer-name GPT2Tokenizer --vocab-file gpt2-vocab.json \\
        --merges-file gpt2-merges.txt --append-eod --output-prefix data/corpus --workers 4

writes ``data/corpus_text_document.bin`` and ``.idx``; use ``data/corpus_text_document`` as
``data_prefix`` in ``configs/common/data/gpt_dataset.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from libai.data.preprocess import TOKENIZERS, preprocess_jsonl  # noqa: E402


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="JSON-lines file, one document per line")
    group.add_argument(
        "--json-keys", nargs="+", default=["text"], help="keys of the text fields to tokenize"
    )
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-name", required=True, choices=sorted(TOKENIZERS))
    group.add_argument("--vocab-file", required=True, help="vocab.json")
    group.add_argument("--merges-file", default=None, help="merges.txt (BPE tokenizers)")
    group.add_argument(
        "--append-eod", action="store_true", help="end every document with <|endoftext|>"
    )
    group = parser.add_argument_group("output data")
    group.add_argument(
        "--output-prefix",
        required=True,
        help="path prefix; writes PREFIX_{key}_document.bin/.idx",
    )
    group.add_argument(
        "--dataset-impl", default="mmap", choices=["mmap"], help="only Megatron's mmap format"
    )
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    group.add_argument("--chunk-size", type=int, default=64, help="lines per task")
    group.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if args.tokenizer_name == "GPT2Tokenizer" and args.merges_file is None:
        parser.error("--merges-file is required for GPT2Tokenizer")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    return args


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prefixes = preprocess_jsonl(
            args.input,
            args.output_prefix,
            vocab_file=args.vocab_file,
            merges_file=args.merges_file,
            json_keys=args.json_keys,
            tokenizer_name=args.tokenizer_name,
            append_eod=args.append_eod,
            workers=args.workers,
            lines_per_chunk=args.chunk_size,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"preprocess_data.py: error: {e}", file=sys.stderr)
        return 1
    for key, prefix in prefixes.items():
        print(f"{key}: {prefix}.bin {prefix}.idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
