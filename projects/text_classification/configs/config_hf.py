"""Fine-tune a pretrained Hugging Face BERT for sentence (or sentence-pair) classification.

``model.path`` is a Hugging Face BERT directory (``config.json``, ``model.safetensors``,
``vocab.txt``), e.g. a download of ``bert-base-uncased``; it sets the shapes and the
backbone weights, and the classifier head starts fresh. The data keys are those of
``config.py`` (the sample data by default; give your own files)::

    CONFIG=projects/text_classification/configs/config_hf.py \\
    bash projects/text_classification/train.sh 2 model.path=/models/bert-base-uncased \\
        dataloader.train.dataset.0.data_path=/data/train.csv \\
        dataloader.train.valid_dataset.data_path=/data/dev.csv model.cfg.num_labels=2

``model.cfg`` holds only what overrides ``config.json`` (``num_labels``,
``classifier_dropout``, dropouts). Under pipeline parallelism also set
``train.dist.pipeline_num_layers`` to the checkpoint's layer count (12 for BERT-base). A
cased model needs ``tokenization.tokenizer.do_lower_case=False``.
"""

from libai.config import LazyCall
from projects.text_classification.modeling import bert_classifier_from_hf

from .config import dataloader, graph, optim, tokenization, train

model = LazyCall(bert_classifier_from_hf)(
    path="/path/to/bert-base-uncased",
    cfg=dict(num_labels=3, classifier_dropout=None),
)
tokenization.tokenizer.vocab_file = "${model.path}/vocab.txt"
tokenization.setup = False  # the vocabulary size is config.json's

dataloader.train.dataset[0].max_seq_length = 128  # the validation set follows

# BERT's fine-tuning recipe: AdamW 2e-5, 10% warmup, 3 epochs
optim.lr = 2e-5
train.update(
    output_dir="output/text_classification_hf",
    train_epoch=3,
    train_iter=0,
    train_micro_batch_size=32,
    warmup_ratio=0.1,
)

__all__ = ["train", "optim", "graph", "tokenization", "dataloader", "model"]
