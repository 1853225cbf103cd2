"""RoBERTa pretraining: masked LM on full-sentence samples (LiBai's config shape).

The model is RoBERTa-base; ``vocab_size`` comes from the tokenizer, whose ``<pad>`` id must
equal ``model.cfg.pad_token_id`` (1 in RoBERTa's vocabulary). Give it a byte-level BPE and a
sentence-split dataset (see ``configs/common/data/roberta_dataset.py``)::

    bash tools/train.sh tools/train_net.py configs/roberta_pretrain.py 8 \\
        tokenization.tokenizer.vocab_file=/data/roberta-vocab.json \\
        tokenization.tokenizer.merges_file=/data/roberta-merges.txt \\
        dataloader.train.dataset.0.data_prefix=/data/corpus_text_sentence \\
        train.dist.device_type=cuda train.dist.tensor_parallel_size=2 train.amp.enabled=True

A shorter ``max_seq_length`` keeps ``model.cfg.max_position_embeddings`` at least
``max_seq_length + 2``.
"""

from libai.config import LazyCall

from .common.data.roberta_dataset import dataloader, tokenization
from .common.models.graph import graph
from .common.models.roberta import model
from .common.optim import optim
from .common.train import train

tokenization.setup = True  # vocab_size from the tokenizer

for ds in dataloader.train.dataset:
    ds.max_seq_length = 512

# RoBERTa-base's recipe (Liu et al., 2019): peak LR 6e-4, betas (0.9, 0.98), 6% warmup
optim.lr = 6e-4
optim.weight_decay = 0.01
optim.betas = (0.9, 0.98)
optim.eps = 1e-6

train.update(
    output_dir="output/roberta_pretrain",
    train_iter=500_000,
    train_micro_batch_size=16,
    test_micro_batch_size=16,
    log_period=20,
    warmup_ratio=0.06,
)
train.checkpointer.update(period=10000, max_to_keep=3)
train.evaluation.update(
    evaluator=LazyCall("libai.evaluation.PPLEvaluator")(loss_key="lm_loss", label_key="lm_labels"),
    eval_period=10000,
    eval_iter=100,
)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
