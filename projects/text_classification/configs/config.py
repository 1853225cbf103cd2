"""Sentence (or sentence-pair) classification with BERT on local CSV files.

Out of the box it trains a small BERT from scratch on the project's sample data (movie-review
sentences labelled negative / neutral / positive, and a WordPiece vocab covering them, in
``projects/text_classification/sample_data/``)::

    bash projects/text_classification/train.sh 1        # or 2, 4, ... processes

Your own data: a CSV / TSV / JSON-lines file per split, with a header naming the columns::

    bash projects/text_classification/train.sh 2 \\
        dataloader.train.dataset.0.data_path=/data/train.csv \\
        dataloader.train.valid_dataset.data_path=/data/dev.csv \\
        dataloader.train.dataset.0.text_columns=[premise,hypothesis] \\
        dataloader.train.dataset.0.label_column=gold_label model.cfg.num_labels=3 \\
        tokenization.tokenizer.vocab_file=/data/vocab.txt

The keys that must agree are written once: the validation set follows the training set's
text columns, label column, max_seq_length and label names (read from the training file,
or listed in ``dataloader.train.dataset.0.labels``), and both check their label count
against ``model.cfg.num_labels``. Fine-tuning a pretrained Hugging Face BERT instead:
``configs/config_hf.py``.
"""

import os

from omegaconf import OmegaConf

from libai.config import LazyCall, get_config
from libai.data import build_nlp_train_loader
from libai.models import BertForClassification
from libai.tokenizer import BertTokenizer
from projects.text_classification.dataset import LabeledTextDataset

# the shipped sample, by absolute path: runs from any working directory
SAMPLE_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data"
)

train = get_config("common/train.py").train
optim = get_config("common/optim.py").optim
graph = get_config("common/models/graph.py").graph
cfg = get_config("common/models/bert.py").cfg

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(BertTokenizer)(
    vocab_file=f"{SAMPLE_DATA}/vocab.txt", do_lower_case=True
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128
tokenization.setup = True  # model.cfg.vocab_size from the tokenizer

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[
        LazyCall(LabeledTextDataset)(
            data_path=f"{SAMPLE_DATA}/train.csv",
            tokenizer="${tokenization.tokenizer}",
            text_columns=["sentence"],  # two names for sentence pairs
            label_column="label",
            max_seq_length=32,
            num_labels="${model.cfg.num_labels}",
            labels=None,  # None: the training file's labels (text: sorted; ids: as they are)
            output_dir="${train.output_dir}",  # labels.json for predict.py
        )
    ],
    valid_dataset=LazyCall(LabeledTextDataset)(
        data_path=f"{SAMPLE_DATA}/valid.csv",
        tokenizer="${tokenization.tokenizer}",
        text_columns="${dataloader.train.dataset[0].text_columns}",
        label_column="${dataloader.train.dataset[0].label_column}",
        max_seq_length="${dataloader.train.dataset[0].max_seq_length}",
        num_labels="${model.cfg.num_labels}",
        labels="${dataloader.train.dataset[0].labels}",
        labels_from="${dataloader.train.dataset[0].data_path}",
    ),
    num_workers=0,
)

# a small BERT: 4 layers, hidden 128 (BERT-base: 12 / 768 / 12 heads / 3072)
cfg.update(
    hidden_layers=4,
    hidden_size=128,
    num_attention_heads=4,
    intermediate_size=512,
    max_position_embeddings=128,
    num_labels=3,
    classifier_dropout=None,  # None: hidden_dropout_prob
)
model = LazyCall(BertForClassification)(cfg=cfg)

optim.lr = 5e-4
optim.weight_decay = 0.01

train.update(
    output_dir="output/text_classification",
    train_epoch=12,
    train_iter=0,
    train_micro_batch_size=16,
    test_micro_batch_size=32,
    log_period=10,
    warmup_ratio=0.1,
)
train.checkpointer.update(period=100, max_to_keep=2)
train.evaluation.update(
    evaluator=LazyCall("libai.evaluation.AccEvaluator")(topk=(1,)),
    eval_period=50,
    eval_metric="Acc@1",
    eval_mode="max",
)

__all__ = ["train", "optim", "graph", "tokenization", "dataloader", "model"]
