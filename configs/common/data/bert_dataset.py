"""BERT pretraining data: a WordPiece tokenizer and a sentence-split Megatron dataset.

The paths are placeholders. Make the dataset with one item per sentence (BERT's
next-sentence task needs documents of several sentences)::

    python tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --tokenizer-name BertTokenizer --vocab-file bert-base-uncased-vocab.txt \\
        --split-sentences --output-prefix data/corpus --workers 4

and override::

    tokenization.tokenizer.vocab_file=/data/bert-base-uncased-vocab.txt
    dataloader.train.dataset.0.data_prefix=/data/corpus_text_sentence

Samples: ``input_ids``, ``attention_mask``, ``tokentype_ids``, ``lm_labels``, ``loss_mask``
(``[max_seq_length]``) and ``ns_labels`` (see :class:`libai.data.datasets.BertDataset`).
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_val_test_loader  # noqa: F401
from libai.data.data_utils import get_indexed_dataset
from libai.data.datasets import BertDataset
from libai.tokenizer import BertTokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(BertTokenizer)(
    vocab_file="/path/to/bert-base-uncased-vocab.txt",
    do_lower_case=True,
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(BertDataset)(
            name="bert",
            tokenizer="${tokenization.tokenizer}",
            data_prefix="/path/to/corpus_text_sentence",
            indexed_dataset=LazyCall(get_indexed_dataset)(
                data_prefix="${..data_prefix}",
                data_impl="mmap",
                skip_warmup=False,
            ),
            max_seq_length=512,
            mask_lm_prob=0.15,
            short_seq_prob=0.1,
            seed=1234,
            binary_head=True,
        ),
    ],
    train_val_test_num_samples=None,  # filled by the trainer: [train, valid, test] samples
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    num_workers=4,
)
