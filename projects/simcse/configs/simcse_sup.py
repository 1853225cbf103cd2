"""Supervised SimCSE: NLI triples (sent0 = premise, sent1 = entailment as the positive,
hard_neg = contradiction as a hard negative) from a CSV; evaluated like the unsupervised one.

    bash tools/train.sh tools/train_net.py projects/simcse/configs/simcse_sup.py 4 \\
        tokenization.tokenizer.vocab_file=/models/bert-base-uncased/vocab.txt \\
        model.cfg.pretrained_model_path=/models/bert-base-uncased \\
        dataloader.train.dataset.0.data_path=/data/nli_for_simcse.csv \\
        dataloader.train.valid_dataset.data_path=/data/sts-b-dev.csv

The paper's settings: batch 512 (here 128 per rank on 4 data-parallel ranks, whose negatives
are gathered), max_seq_length 32, lr 5e-5, three epochs, [CLS] with the MLP in training and
evaluation, temperature 0.05.
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_train_loader
from projects.simcse.dataset import STSDataset, SupervisedDataset

from .common import cfg, graph, model, optim, tokenization, train

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[
        LazyCall(SupervisedDataset)(
            data_path="/path/to/nli_for_simcse.csv",
            tokenizer="${tokenization.tokenizer}",
            max_seq_length=32,
            columns=["sent0", "sent1", "hard_neg"],
        ),
    ],
    valid_dataset=LazyCall(STSDataset)(
        data_path="/path/to/sts-dev.csv",
        tokenizer="${tokenization.tokenizer}",
        max_seq_length="${dataloader.train.dataset.0.max_seq_length}",
    ),
    num_workers=2,
)

cfg.update(pooling="cls", mlp="always", temperature=0.05, hard_negative_weight=0.0)
optim.lr = 5e-5

train.update(
    output_dir="output/simcse_sup",
    train_epoch=3,
    train_micro_batch_size=128,
    test_micro_batch_size=128,
)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
