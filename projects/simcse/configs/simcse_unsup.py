"""Unsupervised SimCSE: each sentence of a text file is its own positive under a second
dropout mask; evaluated by the Spearman correlation on an STS CSV (sentence1,sentence2,score).

    bash tools/train.sh tools/train_net.py projects/simcse/configs/simcse_unsup.py 1 \\
        tokenization.tokenizer.vocab_file=/models/bert-base-uncased/vocab.txt \\
        model.cfg.pretrained_model_path=/models/bert-base-uncased \\
        dataloader.train.dataset.0.data_path=/data/wiki1m_for_simcse.txt \\
        dataloader.train.valid_dataset.data_path=/data/sts-b-dev.csv

The paper's settings: batch 64, max_seq_length 32, lr 3e-5, one epoch, [CLS] with the MLP
in training only, temperature 0.05.
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_train_loader
from projects.simcse.dataset import STSDataset, UnsupervisedDataset

from .common import cfg, graph, model, optim, tokenization, train

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[
        LazyCall(UnsupervisedDataset)(
            data_path="/path/to/wiki1m_for_simcse.txt",
            tokenizer="${tokenization.tokenizer}",
            max_seq_length=32,
        ),
    ],
    valid_dataset=LazyCall(STSDataset)(
        data_path="/path/to/sts-dev.csv",
        tokenizer="${tokenization.tokenizer}",
        max_seq_length="${dataloader.train.dataset.0.max_seq_length}",
    ),
    num_workers=2,
)

cfg.update(pooling="cls", mlp="train_only", temperature=0.05)
optim.lr = 3e-5

train.update(
    output_dir="output/simcse_unsup",
    train_epoch=1,
    train_micro_batch_size=64,
    test_micro_batch_size=64,
)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
