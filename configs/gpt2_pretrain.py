"""GPT-2 pretraining (LiBai's config shape).

Out of the box it trains a small GPT-2 on a sample dataset built offline from the Python
standard library's sources (a byte-level BPE trained on them in seconds), on CPU, in a few
minutes:

    bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py 2

The sample dataset is built in our cache directory (``$LIBAI_SAMPLE_DATA_DIR`` or
``~/.cache/libai/sample_gpt2``) because the data config names it explicitly
(``${libai_sample:...}``, see ``configs/common/data/gpt_dataset.py``). Point it at real data
(vocabulary, merges and data prefix: your files are only read) and scale it with overrides
alone, e.g.

    bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py 8 \\
        model.cfg.hidden_layers=12 model.cfg.hidden_size=768 model.cfg.num_attention_heads=12 \\
        model.cfg.ffn_hidden_size=3072 model.cfg.max_seq_length=1024 \\
        train.dist.device_type=cuda train.dist.tensor_parallel_size=2 \\
        train.dist.pipeline_parallel_size=2 train.amp.enabled=True \\
        tokenization.tokenizer.vocab_file=/data/gpt/gpt2-vocab.json \\
        tokenization.tokenizer.merges_file=/data/gpt/gpt2-merges.txt \\
        "dataloader.train.dataset.0.data_prefix=/data/gpt/my_text_document" ...
"""

from .common.data.gpt_dataset import dataloader, tokenization
from .common.models.gpt import cfg, model
from .common.models.graph import graph
from .common.optim import optim
from .common.train import train

# a small GPT-2 that learns visibly on 2 CPU cores; vocab_size comes from the tokenizer
cfg.hidden_layers = 4
cfg.hidden_size = 192
cfg.num_attention_heads = 4
cfg.ffn_hidden_size = 768
cfg.max_seq_length = 128
cfg.embedding_dropout_prob = 0.0
cfg.attention_dropout_prob = 0.0
cfg.output_dropout_prob = 0.0
tokenization.setup = True

# an interpolation, not a copy: `model.cfg.max_seq_length=64` on the command line moves the
# dataset to 64 too (a copy made here would stay at 128)
for ds in dataloader.train.dataset:
    ds.max_seq_length = "${model.cfg.max_seq_length}"

optim.lr = 2e-3

train.update(
    output_dir="output/gpt2_pretrain",
    train_iter=200,
    train_micro_batch_size=8,
    test_micro_batch_size=8,
    log_period=10,
    warmup_ratio=0.05,
)
train.checkpointer.update(period=100, max_to_keep=3)
train.evaluation.update(eval_period=50, eval_iter=10)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
