"""Accelerate an unmodified Hugging Face model from the command line (Rapidformer's black box).

python tools/accelerate.py --task sequence_classification --pretrained-model-name-or-path DIR \
    --data-path train.csv --validation-path dev.csv --text-columns sentence1,sentence2 \
    --epochs 3 --micro-batch-size 16 --global-batch-size 64 --mixed-precision
bash tools/train.sh tools/accelerate.py - 2 --task ...        # 2 processes (any N, any nodes)
python tools/accelerate.py --help                              # every flag
"""

import os
import sys

# this file is named like Hugging Face's `accelerate` package: keep its folder off the import
# path, or transformers would take it for that package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]

from libai.accelerate.cli import console_main  # noqa: E402

if __name__ == "__main__":
    console_main()
