"""Run a text-generation, fill-mask, text- or image-classification pipeline on any layout;
rank 0 prints.

    bash tools/infer.sh tools/infer_demo.py 4 --task text-generation --model-path hf_llama \
        --tp 2 --pp 2 --max-new-tokens 32 "Once upon a time"
    bash tools/infer.sh tools/infer_demo.py 2 --task fill-mask --model-path path/to/hf_bert \\
        --tp 2 "paris is the [MASK] of france."
    bash tools/infer.sh tools/infer_demo.py 2 --task image-classification \\
        --model-path path/to/hf_vit --pp 2 cat.png dog.png
    python tools/infer_demo.py --task text-classification --config-file my_bert.py \\
        --model-path output/my_run --mode libai "a fine movie"
"""

from __future__ import annotations

import argparse
import json

from libai import dist
from libai.inference import (
    FillMaskPipeline,
    ImageClassificationPipeline,
    TextClassificationPipeline,
    TextGenerationPipeline,
)

TASKS = {
    "fill-mask": FillMaskPipeline,
    "text-classification": TextClassificationPipeline,
    "image-classification": ImageClassificationPipeline,
    "text-generation": TextGenerationPipeline,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--mode", choices=["huggingface", "libai", "random"], default="huggingface")
    parser.add_argument("--config-file", default=None)
    parser.add_argument("--dp", type=int, default=None, help="data parallel (default: derived)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="text-generation")
    parser.add_argument("--num-beams", type=int, default=None, help="text-generation")
    parser.add_argument("inputs", nargs="+", help="texts, or image files")
    args = parser.parse_args()

    pipeline = TASKS[args.task](
        args.config_file,
        data_parallel=args.dp,
        tensor_parallel=args.tp,
        pipeline_parallel=args.pp,
        model_path=args.model_path,
        mode=args.mode,
        device=args.device,
    )
    params = {
        k: v
        for k, v in (
            ("top_k", args.top_k),
            ("max_new_tokens", args.max_new_tokens),
            ("num_beams", args.num_beams),
        )
        if v is not None
    }
    results = pipeline(args.inputs, **params)
    if dist.is_main_process():
        print(json.dumps(results, indent=2, ensure_ascii=False))
    dist.destroy_dist()


if __name__ == "__main__":
    main()
