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

import os
import sys

# the working directory first (the user's own modules and projects/<name> win), then this
# checkout (its libai, and its projects/ after the user's)
sys.path[:0] = [os.getcwd(), os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))]

from libai.align.cli import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    if "libai.utils.distributed" in sys.modules:  # not on bad input: nothing was set up
        from libai.utils import distributed as dist

        dist.destroy_dist()
    sys.exit(code)
