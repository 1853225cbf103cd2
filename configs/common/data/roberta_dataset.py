"""RoBERTa pretraining data: a byte-level BPE tokenizer and a Megatron dataset.

Samples pack whole sentences (RoBERTa's FULL-SENTENCES), so a sentence-split dataset packs
tightest; the paths are placeholders::

    python tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --tokenizer-name RobertaTokenizer --vocab-file roberta-vocab.json \\
        --merges-file roberta-merges.txt --split-sentences --output-prefix data/corpus

and override::

    tokenization.tokenizer.vocab_file=/data/roberta-vocab.json
    tokenization.tokenizer.merges_file=/data/roberta-merges.txt
    dataloader.train.dataset.0.data_prefix=/data/corpus_text_sentence

Samples: ``input_ids``, ``attention_mask``, ``tokentype_ids`` (zeros), ``lm_labels``,
``loss_mask``, all ``[max_seq_length]`` (see :class:`libai.data.datasets.RobertaDataset`).
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_val_test_loader  # noqa: F401
from libai.data.data_utils import get_indexed_dataset
from libai.data.datasets import RobertaDataset
from libai.tokenizer import RobertaTokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(RobertaTokenizer)(
    vocab_file="/path/to/roberta-vocab.json",
    merges_file="/path/to/roberta-merges.txt",
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(RobertaDataset)(
            name="roberta",
            tokenizer="${tokenization.tokenizer}",
            data_prefix="/path/to/corpus_text_sentence",
            indexed_dataset=LazyCall(get_indexed_dataset)(
                data_prefix="${..data_prefix}",
                data_impl="mmap",
                skip_warmup=False,
            ),
            max_seq_length=512,
            mask_lm_prob=0.15,
            seed=1234,
        ),
    ],
    train_val_test_num_samples=None,  # filled by the trainer: [train, valid, test] samples
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    num_workers=4,
)
