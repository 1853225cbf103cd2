"""GPT-2 pretraining data: a byte-level BPE tokenizer and Megatron ``.bin/.idx`` datasets.

By default the paths are ``${libai_sample:vocab_file}``, ``${libai_sample:merges_file}`` and
``${libai_sample:data_prefix}``: the built-in sample dataset (Python standard library sources,
see ``libai/data/sample_corpus.py``) in our cache directory, ``$LIBAI_SAMPLE_DATA_DIR`` or
``~/.cache/libai/sample_gpt2``. Those interpolations are what tells the trainer to build it
(there, on first use); a saved ``config.yaml`` keeps them. For your own corpus, run
``tools/preprocess_data.py`` and override all three::

    tokenization.tokenizer.vocab_file=/data/gpt2-vocab.json
    tokenization.tokenizer.merges_file=/data/gpt2-merges.txt
    dataloader.train.dataset.0.data_prefix=/data/corpus_text_document

Your files are only read, whatever they are called. Override only some of the three and the
others still name the sample dataset, which is then still built (in the cache directory only).
(``indexed_dataset.data_prefix`` follows ``data_prefix`` unless set on its own.)
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_val_test_loader  # noqa: F401
from libai.data.data_utils import get_indexed_dataset
from libai.data.datasets import GPT2Dataset
from libai.tokenizer import GPT2Tokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(GPT2Tokenizer)(
    vocab_file="${libai_sample:vocab_file}",
    merges_file="${libai_sample:merges_file}",
)
tokenization.append_eod = True
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(GPT2Dataset)(
            name="gpt-2",
            data_prefix="${libai_sample:data_prefix}",
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
