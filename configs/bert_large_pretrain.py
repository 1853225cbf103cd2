"""BERT-large pretraining: masked LM + next sentence (LiBai's config shape).

The model is BERT-large (24 layers, hidden 1024, 16 heads) with BERT's recipe (AdamW 1e-4,
weight decay 0.01, 1% warmup); ``vocab_size`` comes from the tokenizer. Give it a WordPiece
vocab and a sentence-split dataset (see ``configs/common/data/bert_dataset.py``)::

    bash tools/train.sh tools/train_net.py configs/bert_large_pretrain.py 8 \\
        tokenization.tokenizer.vocab_file=/data/bert-large-uncased-vocab.txt \\
        dataloader.train.dataset.0.data_prefix=/data/corpus_text_sentence \\
        train.dist.device_type=cuda train.dist.tensor_parallel_size=2 \\
        train.dist.pipeline_parallel_size=2 train.amp.enabled=True

The batches carry ``input_ids``, ``attention_mask``, ``tokentype_ids``, ``lm_labels``,
``loss_mask`` and ``ns_labels``; the model returns ``lm_loss`` and ``sop_loss`` (the
next-sentence loss), which the trainer sums. Evaluation reports a perplexity over the masked
tokens (of the summed eval loss, as the trainer computes it: it includes ``sop_loss``).
"""

from libai.config import LazyCall

from .common.data.bert_dataset import dataloader, tokenization
from .common.models.bert import cfg, model
from .common.models.graph import graph
from .common.optim import optim
from .common.train import train

# BERT-large
cfg.hidden_layers = 24
cfg.hidden_size = 1024
cfg.num_attention_heads = 16
cfg.intermediate_size = 4096
cfg.max_position_embeddings = 512
tokenization.setup = True  # vocab_size from the tokenizer

# follows the model (an interpolation): `model.cfg.max_position_embeddings=128` shortens both
for ds in dataloader.train.dataset:
    ds.max_seq_length = "${model.cfg.max_position_embeddings}"

optim.lr = 1e-4
optim.weight_decay = 0.01

train.update(
    output_dir="output/bert_large_pretrain",
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
