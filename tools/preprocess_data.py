"""Tokenize a JSON-lines corpus into Megatron ``.bin`` / ``.idx`` files for pretraining.

Examples::

    python tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --tokenizer-name GPT2Tokenizer --vocab-file gpt2-vocab.json \\
        --merges-file gpt2-merges.txt --append-eod --output-prefix data/corpus --workers 4

writes ``data/corpus_text_document.bin`` and ``.idx``; use ``data/corpus_text_document`` as
``data_prefix`` in ``configs/common/data/gpt_dataset.py``. Other tokenizers::

    --tokenizer-name BertTokenizer --vocab-file vocab.txt [--no-do-lower-case] --split-sentences
        [--do-chinese-wwm]  (LiBai's Chinese whole-word segmentation; needs jieba)
    --tokenizer-name RobertaTokenizer --vocab-file vocab.json --merges-file merges.txt
    --tokenizer-name T5Tokenizer --vocab-file spiece.model [--extra-ids 100]
    --tokenizer-name JsonTokenizer --tokenizer-file llama_dir/ (or .../tokenizer.json)

Megatron's flag names work too (``--tokenizer-type BertWordPieceLowerCase`` /
``BertWordPieceCase`` / ``GPT2BPETokenizer``, ``--vocab``, ``--merge-file``)::

    python tools/preprocess_data.py --input corpus.jsonl --output-prefix gpt_small \
        --vocab gpt2-vocab.json --dataset-impl mmap --tokenizer-type GPT2BPETokenizer \
        --merge-file gpt2-merges.txt --append-eod

``--split-sentences`` (BERT-style datasets) stores each sentence of a document as its own
item, in ``PREFIX_{key}_sentence.bin/.idx``. Sentences are split by a simple rule-based
splitter (line breaks, and ``. ! ?`` before a capital letter; see
``libai/data/sentence_split.py``), not NLTK's punkt model as in Megatron / LiBai; a corpus
with one sentence per line is split exactly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

# this checkout's libai (it loads no user module: the working directory is not searched)
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from libai.data.preprocess import (  # noqa: E402
    TOKENIZER_FILES,
    TOKENIZER_OPTIONS,
    TOKENIZERS,
    preprocess_jsonl,
)
from libai.tokenizer.chinese_wwm import jieba_segmenter  # noqa: E402

_OPTIONS = ("do_lower_case", "do_chinese_wwm", "extra_ids", "eos_token")
#: Megatron's ``--tokenizer-type`` -> (``--tokenizer-name``, ``do_lower_case``)
MEGATRON_TOKENIZERS = {
    "BertWordPieceLowerCase": ("BertTokenizer", True),
    "BertWordPieceCase": ("BertTokenizer", False),
    "GPT2BPETokenizer": ("GPT2Tokenizer", None),
}


def megatron_tokenizer(parser, args) -> None:
    """``--tokenizer-type`` (Megatron's flag) sets ``--tokenizer-name`` and the case."""
    if args.tokenizer_type is None:
        if args.tokenizer_name is None:
            parser.error("give --tokenizer-name (or Megatron's --tokenizer-type)")
        return
    if args.tokenizer_name is not None:
        parser.error("give --tokenizer-name or --tokenizer-type, not both")
    args.tokenizer_name, lower = MEGATRON_TOKENIZERS[args.tokenizer_type]
    if lower is not None:
        if args.do_lower_case not in (None, lower):
            parser.error(f"--tokenizer-type {args.tokenizer_type} contradicts --do-lower-case")
        args.do_lower_case = lower


def get_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="JSON-lines file, one document per line")
    group.add_argument(
        "--json-keys", nargs="+", default=["text"], help="keys of the text fields to tokenize"
    )
    group.add_argument(
        "--split-sentences",
        action="store_true",
        help="store each sentence of a document as an item (rule-based splitter, for BERT)",
    )
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-name", choices=sorted(TOKENIZERS))
    group.add_argument(
        "--tokenizer-type",
        choices=sorted(MEGATRON_TOKENIZERS),
        help="Megatron's name: instead of --tokenizer-name (and --do-lower-case)",
    )
    group.add_argument(
        "--vocab-file", "--vocab", default=None, help="vocab.json / vocab.txt / spiece.model"
    )
    group.add_argument(
        "--merges-file", "--merge-file", default=None, help="merges.txt (BPE tokenizers)"
    )
    group.add_argument(
        "--tokenizer-file",
        default=None,
        help="tokenizer.json, or a directory with tokenizer.json + tokenizer_config.json "
        "(JsonTokenizer)",
    )
    group.add_argument(
        "--do-lower-case",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case the text (BertTokenizer; default: lower-case)",
    )
    group.add_argument(
        "--do-chinese-wwm",
        action="store_const",
        const=True,
        default=None,
        help="LiBai's Chinese whole-word segmentation with jieba: a word's later characters "
        "are ## pieces, for masking_style='bert-cn-wwm' (BertTokenizer; needs pip install jieba)",
    )
    group.add_argument(
        "--extra-ids", type=int, default=None, help="sentinel tokens (T5Tokenizer; default 100)"
    )
    group.add_argument("--eos-token", default=None, help="end-of-document token (JsonTokenizer)")
    group.add_argument(
        "--append-eod",
        action="store_true",
        help="end every document with the tokenizer's end-of-document token",
    )
    group = parser.add_argument_group("output data")
    group.add_argument(
        "--output-prefix",
        required=True,
        help="path prefix; writes PREFIX_{key}_document.bin/.idx (_sentence with "
        "--split-sentences)",
    )
    group.add_argument(
        "--dataset-impl",
        default="mmap",
        choices=["mmap", "lazy", "cached"],
        help="mmap (Megatron's), or lazy / cached: the older TNTIDX format LiBai reads with "
        "IndexedDataset (int32 values)",
    )
    group.add_argument(
        "--output-format",
        default="megatron",
        choices=["megatron", "fleetx"],
        help="megatron: the .bin / .idx pair (--dataset-impl); fleetx: PaddleFleetX's "
        "PREFIX_{key}_document_ids.npy + _idx.npz instead (GPTDataset's input_dir in a FleetX "
        "YAML)",
    )
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    group.add_argument("--chunk-size", type=int, default=64, help="lines per task")
    group.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    group.add_argument(
        "--log-interval",
        type=int,
        default=None,
        help="log a progress line every this many documents (LiBai's)",
    )
    args = parser.parse_args(argv)
    megatron_tokenizer(parser, args)
    name = args.tokenizer_name
    for arg in TOKENIZER_FILES[name]:
        if getattr(args, arg) is None:
            parser.error(f"--{arg.replace('_', '-')} is required for {name}")
    for arg in _OPTIONS:
        if getattr(args, arg) is not None and arg not in TOKENIZER_OPTIONS.get(name, ()):
            parser.error(f"--{arg.replace('_', '-')} does not apply to {name}")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.output_format == "fleetx" and args.dataset_impl != "mmap":
        parser.error("--output-format fleetx is written from the mmap format: drop --dataset-impl")
    return args


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.do_chinese_wwm:
            jieba_segmenter()  # an error before any work, naming `pip install jieba`
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
            tokenizer_file=args.tokenizer_file,
            tokenizer_options={arg: getattr(args, arg) for arg in _OPTIONS},
            split_sentences=args.split_sentences,
            dataset_impl=args.dataset_impl,
            log_interval=args.log_interval,
        )
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"preprocess_data.py: error: {e}", file=sys.stderr)
        return 1
    for key, prefix in prefixes.items():
        if args.output_format == "fleetx":
            from libai.data.datasets.fleetx_gpt import convert_to_fleetx

            convert_to_fleetx(prefix)
            for suffix in (".bin", ".idx"):  # this run's own intermediate files
                os.remove(prefix + suffix)
            print(f"{key}: {prefix}_ids.npy {prefix}_idx.npz")
            continue
        print(f"{key}: {prefix}.bin {prefix}.idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
