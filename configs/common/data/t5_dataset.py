"""T5 pretraining data: a sentencepiece tokenizer with sentinels and a Megatron dataset.

Span corruption reads the documents as one token stream, so sentence-split and plain
datasets both work; the paths are placeholders::

    python tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --tokenizer-name T5Tokenizer --vocab-file spiece.model --append-eod \\
        --output-prefix data/corpus

and override::

    tokenization.tokenizer.vocab_file=/data/spiece.model
    dataloader.train.dataset.0.data_prefix=/data/corpus_text_document

Samples: ``encoder_input_ids``, ``encoder_attn_mask`` (``[max_seq_length]``),
``decoder_input_ids``, ``decoder_attn_mask``, ``lm_labels``, ``loss_mask``
(``[max_seq_length_dec]``); see :class:`libai.data.datasets.T5Dataset`.
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_val_test_loader  # noqa: F401
from libai.data.data_utils import get_indexed_dataset
from libai.data.datasets import T5Dataset
from libai.tokenizer import T5Tokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(T5Tokenizer)(
    vocab_file="/path/to/spiece.model",
    extra_ids=100,
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(T5Dataset)(
            name="t5",
            tokenizer="${tokenization.tokenizer}",
            data_prefix="/path/to/corpus_text_document",
            indexed_dataset=LazyCall(get_indexed_dataset)(
                data_prefix="${..data_prefix}",
                data_impl="mmap",
                skip_warmup=False,
            ),
            max_seq_length=512,
            max_seq_length_dec=128,
            noise_density=0.15,
            mean_noise_span_length=3.0,
            seed=1234,
        ),
    ],
    train_val_test_num_samples=None,  # filled by the trainer: [train, valid, test] samples
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    num_workers=4,
)
