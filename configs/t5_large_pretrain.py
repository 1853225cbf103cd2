"""T5-large pretraining with span corruption (LiBai's config shape).

The model is T5-large v1.0 (24 + 24 layers, hidden 1024, 16 heads of 64, MLP 4096, relu,
tied head); ``vocab_size`` comes from the tokenizer (sentencepiece + 100 sentinels). Give it
an ``spiece.model`` and an indexed corpus (see ``configs/common/data/t5_dataset.py``)::

    bash tools/train.sh tools/train_net.py configs/t5_large_pretrain.py 8 \\
        tokenization.tokenizer.vocab_file=/data/spiece.model \\
        dataloader.train.dataset.0.data_prefix=/data/corpus_text_document \\
        train.dist.device_type=cuda train.dist.tensor_parallel_size=2 \\
        train.dist.pipeline_parallel_size=2 train.dist.pipeline_num_layers=48 \\
        train.amp.enabled=True

Pipeline parallelism numbers the layers encoder then decoder, so ``pipeline_num_layers`` is
``hidden_layers + num_decoder_layers`` (48 here; the trainer fills that in when unset). The batches carry ``encoder_input_ids``, ``decoder_input_ids``,
``encoder_attn_mask``, ``decoder_attn_mask``, ``lm_labels`` and ``loss_mask``; the model
returns ``lm_loss``; evaluation reports the perplexity over the target tokens.
"""

from libai.config import LazyCall

from .common.data.t5_dataset import dataloader, tokenization
from .common.models.graph import graph
from .common.models.t5 import cfg, model
from .common.optim import optim
from .common.train import train

# T5-large
cfg.hidden_size = 1024
cfg.hidden_layers = 24
cfg.num_decoder_layers = 24
cfg.num_attention_heads = 16
cfg.head_size = 64
cfg.ffn_hidden_size = 4096
tokenization.setup = True  # vocab_size from the tokenizer

for ds in dataloader.train.dataset:
    ds.max_seq_length = 512
    ds.max_seq_length_dec = 128

optim.lr = 1e-4
optim.weight_decay = 0.01

train.update(
    output_dir="output/t5_large_pretrain",
    train_iter=1_000_000,
    train_micro_batch_size=16,
    test_micro_batch_size=16,
    log_period=20,
    warmup_ratio=0.01,
)
train.checkpointer.update(period=10000, max_to_keep=3)
train.evaluation.update(
    evaluator=LazyCall("libai.evaluation.PPLEvaluator")(loss_key="lm_loss", label_key="lm_labels"),
    eval_period=10000,
    eval_iter=100,
)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
