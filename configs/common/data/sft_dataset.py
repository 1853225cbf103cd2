"""Instruction tuning (SFT) data: a Hugging Face ``tokenizer.json`` and JSON-lines records.

Each line of the data file is ``{"instruction": ..., "input": ..., "output": ...}``
(``prompt`` / ``response`` work too); see :class:`libai.data.datasets.SFTDataset` for the
prompt template and the field names. The paths are placeholders; override::

    tokenization.tokenizer.tokenizer_file=/models/llama/          (or .../tokenizer.json)
    dataloader.train.dataset.0.data_path=/data/sft_train.jsonl

and, for evaluation, set ``dataloader.train.valid_dataset`` to another
``LazyCall(SFTDataset)(data_path=/data/sft_valid.jsonl, ...)``. Samples: ``input_ids``,
``attention_mask`` and ``labels`` (prompt and padding -100, not shifted).
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_loader  # noqa: F401
from libai.data.datasets import SFTDataset
from libai.data.datasets.sft_dataset import (
    DEFAULT_PROMPT_TEMPLATE,
    DEFAULT_PROMPT_TEMPLATE_NO_INPUT,
)
from libai.tokenizer import JsonTokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(JsonTokenizer)(
    tokenizer_file="/path/to/tokenizer.json",
    # None: from the directory's tokenizer_config.json; set them for a bare tokenizer.json
    eos_token=None,
    pad_token=None,
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[
        LazyCall(SFTDataset)(
            data_path="/path/to/sft_train.jsonl",
            tokenizer="${tokenization.tokenizer}",
            max_seq_length=1024,
            prompt_template=DEFAULT_PROMPT_TEMPLATE,
            prompt_template_no_input=DEFAULT_PROMPT_TEMPLATE_NO_INPUT,
            instruction_key=["instruction", "prompt"],
            input_key=["input"],
            output_key=["output", "response"],
            add_bos=False,
            add_eos=True,
        ),
    ],
    valid_dataset=None,
    num_workers=0,
)
