"""Classify new texts with a model this project trained; prints one JSON line per input.

    python projects/text_classification/predict.py output/text_classification \\
        "The plot was wonderful." "The acting felt dull."
    python projects/text_classification/predict.py OUTPUT_DIR --input texts.txt --top-k 2
    bash tools/infer.sh projects/text_classification/predict.py 2 OUTPUT_DIR --tp 2 "..."

``OUTPUT_DIR`` is the training run's ``train.output_dir``: its ``config.yaml`` rebuilds the
model and tokenizer, its ``labels.json`` names the classes, and its newest checkpoint
(``--checkpoint model_best`` for another) gives the weights, on any layout. A sentence-pair
model takes its texts two by two (first, second, first, second, ...), or, with ``--input``,
one pair per line with the two texts separated by a tab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

import torch  # noqa: E402

from libai import dist  # noqa: E402
from libai.data.datasets.text_classification import SampleEncoder  # noqa: E402
from libai.dist.cli import run_cli  # noqa: E402
from libai.inference import TextClassificationPipeline  # noqa: E402
from projects.text_classification.dataset import read_labels  # noqa: E402


class LabeledTextClassifier(TextClassificationPipeline):
    """``TextClassificationPipeline`` on a training output directory of this project.

    Texts are encoded as the training samples were (sentence pairs, truncation to the
    training ``max_seq_length``) and labelled with the names of ``labels.json``. Call it with
    texts, or with ``(first, second)`` pairs for a pair model; like every libai pipeline it is
    collective (every rank calls it) and returns the results on rank 0, ``None`` elsewhere.

    Args:
        output_dir: the training ``train.output_dir``.
        checkpoint: a checkpoint directory (``model_best``, relative to ``output_dir`` or
            not); ``None``: the newest (``last_checkpoint``).
        **kwargs: the layout and call parameters of :class:`BasePipeline`
            (``tensor_parallel=2``, ``top_k=2``, ``device="cuda"``, ...).
    """

    def __init__(self, output_dir, checkpoint=None, **kwargs):
        output_dir = os.fspath(output_dir)
        config_file = os.path.join(output_dir, "config.yaml")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(
                f"{config_file} not found: pass the output directory of a training run "
                "(train.output_dir), which holds config.yaml and labels.json."
            )
        self.label_record = read_labels(output_dir)
        self.label_names = [str(name) for name in self.label_record["labels"]]
        self.pair = len(self.label_record["text_columns"]) == 2
        if checkpoint is not None and not os.path.isabs(checkpoint):
            inside = os.path.join(output_dir, checkpoint)
            checkpoint = inside if os.path.exists(inside) else checkpoint
        super().__init__(
            config_file=config_file, model_path=checkpoint or output_dir, mode="libai", **kwargs
        )
        self.hf_config = {"id2label": dict(enumerate(self.label_names))}
        self.encoder = SampleEncoder(
            self.tokenizer, self.label_record["max_seq_length"], pair=self.pair
        )

    def _as_batch(self, inputs) -> tuple[list, bool]:
        if self.pair and _is_pair(inputs):
            return [inputs], True
        return super()._as_batch(inputs)

    def preprocess(self, inputs: list, **params) -> dict:
        samples = [self.encoder(*self._texts(item)) for item in inputs]
        batch = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
        return self.to_device(batch)

    def _texts(self, item) -> tuple[str, ...]:
        if self.pair and not _is_pair(item):
            raise ValueError(
                f"this model classifies sentence pairs: give (first, second), got {item!r}"
            )
        if not self.pair and not isinstance(item, str):
            raise ValueError(f"this model classifies single texts (str), got {item!r}")
        return tuple(item) if self.pair else (item,)


def _is_pair(item) -> bool:
    return (
        isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(t, str) for t in item)
    )


def read_inputs(args, pair: bool) -> list:
    """The texts (or pairs) of the command line and of ``--input``."""
    texts = list(args.texts)
    if pair and len(texts) % 2:
        raise ValueError(
            f"this model classifies sentence pairs: give the texts two by two, got {len(texts)}"
        )
    inputs = [tuple(texts[i : i + 2]) for i in range(0, len(texts), 2)] if pair else texts
    if args.input:
        with open(args.input, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                parts = line.split("\t")
                if len(parts) != 1 + pair:
                    want = "two tab-separated texts" if pair else "one text (no tab)"
                    raise ValueError(f"{args.input}, line {number}: expected {want}, got {line!r}")
                inputs.append(tuple(parts) if pair else parts[0])
    if not inputs:
        raise ValueError("no texts given: pass them as arguments or with --input FILE")
    return inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("output_dir", help="the training run's train.output_dir")
    parser.add_argument("texts", nargs="*", help="texts to classify (pairs: two by two)")
    parser.add_argument("--input", help="a file of texts, one per line (pairs: tab-separated)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: the newest)")
    parser.add_argument("--top-k", type=int, default=None, help="rank this many labels")
    parser.add_argument("--dp", type=int, default=None, help="data parallel (default: derived)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_intermixed_args(argv)  # options may come between the texts

    # bad inputs fail before the model is built
    inputs = read_inputs(args, len(read_labels(args.output_dir)["text_columns"]) == 2)
    classifier = LabeledTextClassifier(
        args.output_dir,
        checkpoint=args.checkpoint,
        data_parallel=args.dp,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        device=args.device,
    )
    params = {} if args.top_k is None else {"top_k": args.top_k}
    results = classifier(inputs, **params)
    if dist.is_main_process():
        for item, result in zip(inputs, results):
            text = list(item) if classifier.pair else item
            answer = result if args.top_k is None else {"labels": result}
            print(json.dumps({"text": text, **answer}, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
