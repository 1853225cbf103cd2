"""Accelerate an unmodified Hugging Face model from the command line (Rapidformer's black box);
the same as the ``libai-accelerate`` console script.

python tools/libai_accelerate.py --task sequence_classification --pretrained-model-name-or-path DIR \
    --data-path train.csv --validation-path dev.csv --text-columns sentence1,sentence2 \
    --epochs 3 --micro-batch-size 16 --global-batch-size 64 --mixed-precision
bash tools/train.sh tools/libai_accelerate.py - 2 --task ...  # 2 processes (any N, nodes)
python tools/libai_accelerate.py --help                        # every flag

(Not named accelerate.py: a file of that name in tools/ would shadow Hugging Face's
``accelerate`` package for every tool here, and transformers fails to import.)
"""

from libai.accelerate.cli import console_main

if __name__ == "__main__":
    console_main()
