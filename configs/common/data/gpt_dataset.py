"""GPT-2 pretraining data: a byte-level BPE tokenizer and Megatron ``.bin/.idx`` datasets.

By default the paths point at the built-in sample dataset (Python standard library sources,
see ``libai/data/sample_corpus.py``) under ``$LIBAI_SAMPLE_DATA_DIR`` or
``~/.cache/libai/sample_gpt2``; the trainer builds it on first use. For your own corpus, run
``tools/preprocess_data.py`` and override::

    tokenization.tokenizer.vocab_file=/data/gpt2-vocab.json
    tokenization.tokenizer.merges_file=/data/gpt2-merges.txt
    dataloader.train.dataset.0.data_prefix=/data/corpus_text_document

(``indexed_dataset.data_prefix`` follows ``data_prefix`` unless set on its own.)
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_val_test_loader  # noqa: F401
from libai.data.data_utils import get_indexed_dataset
from libai.data.datasets import GPT2Dataset
from libai.data.sample_corpus import sample_dataset_paths
from libai.tokenizer import GPT2Tokenizer

_sample = sample_dataset_paths()

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(GPT2Tokenizer)(
    vocab_file=_sample["vocab_file"],
    merges_file=_sample["merges_file"],
)
tokenization.append_eod = True
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(GPT2Dataset)(
            name="gpt-2",
            data_prefix=_sample["data_prefix"],
            indexed_dataset=LazyCall(get_indexed_dataset)(
                data_prefix="${..data_prefix}",
                data_impl="mmap",
                skip_warmup=False,
            ),
            max_seq_length=1024,
            seed=1234,
        ),
    ],
    train_val_test_num_samples=None,  # filled by the trainer: [train, valid, test] samples
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    num_workers=0,
)
