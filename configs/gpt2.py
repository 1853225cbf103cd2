"""GPT-2 pretraining, the design card's command (LiBai's ``configs/gpt2_pretrain.py`` shapes):

    bash tools/train.sh tools/train_net.py configs/gpt2.py 8

trains a 6-layer GPT-2 (hidden 384, 16 heads, 1024 positions) on the built-in sample dataset
(Python standard library sources, built offline on first use) with data 2 x tensor 2 x
pipeline 2 on 8 processes. The layout follows the launch: tensor and pipeline parallel 2 each
when the world size allows it, data parallel takes the rest, so the same file runs on 1
process (1 x 1 x 1), 2 (tensor 2) or 4 (tensor 2 x pipeline 2). ``train.dist.*`` on the
command line always wins. For real data and GPUs, e.g.

    bash tools/train.sh tools/train_net.py configs/gpt2.py 8 train.dist.device_type=cuda \\
        train.amp.enabled=True "dataloader.train.dataset.0.data_prefix=/data/my_text_document" \\
        tokenization.tokenizer.vocab_file=/data/gpt2-vocab.json \\
        tokenization.tokenizer.merges_file=/data/gpt2-merges.txt
"""

import os

from .common.data.gpt_dataset import dataloader, tokenization
from .common.models.gpt import model
from .common.models.graph import graph
from .common.optim import optim
from .common.train import train

# LiBai's GPT-2 pretraining shapes; vocab_size comes from the tokenizer
model.cfg.embedding_dropout_prob = 0.1
model.cfg.attention_dropout_prob = 0.1
model.cfg.num_attention_heads = 16
model.cfg.hidden_size = 384
model.cfg.ffn_hidden_size = 1536
model.cfg.hidden_layers = 6
model.cfg.max_seq_length = 1024
tokenization.setup = True

# the dataset follows the model: one override (model.cfg.max_seq_length=...) changes both
for ds in dataloader.train.dataset:
    ds.max_seq_length = "${model.cfg.max_seq_length}"

# torchrun sets WORLD_SIZE before the config is loaded; a plain `python` run is a world of one
_world = int(os.environ.get("WORLD_SIZE", "1"))
_tp = 2 if _world % 2 == 0 else 1
_pp = 2 if _world % (2 * _tp) == 0 and _world >= 4 else 1
train.dist.update(
    data_parallel_size=None,  # derived: world / (tensor x pipeline)
    tensor_parallel_size=_tp,
    pipeline_parallel_size=_pp,
    pipeline_num_layers="${model.cfg.hidden_layers}",
)

optim.lr = 1.5e-4

train.update(
    output_dir="output/gpt2",
    train_iter=10000,
    train_micro_batch_size=4,
    # pipeline parallel runs the accumulation steps as its micro-batches: at least one per
    # stage is required; m = 2 per stage keeps the 1F1B bubble, (pp - 1) / (m + pp - 1), at 1/5
    num_accumulation_steps=2 * _pp if _pp > 1 else 1,
    test_micro_batch_size=4,
    log_period=20,
    warmup_ratio=0.01,
)
train.checkpointer.update(period=1000, max_to_keep=3)
train.evaluation.update(eval_period=1000, eval_iter=20)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
