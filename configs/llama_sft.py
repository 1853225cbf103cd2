"""Instruction fine-tuning (SFT) of a Llama-family causal LM on JSON-lines records.

Data: ``{"instruction": ..., "input": ..., "output": ...}`` per line and a Hugging Face
``tokenizer.json`` (see ``configs/common/data/sft_dataset.py``); only the response tokens
carry loss. Out of the box the model is a small random Llama (~20M parameters with a 32k
vocabulary); its ``vocab_size`` comes from the tokenizer::

    bash tools/train.sh tools/train_net.py configs/llama_sft.py 2 \\
        tokenization.tokenizer.tokenizer_file=/models/llama/tokenizer.json \\
        dataloader.train.dataset.0.data_path=/data/alpaca.jsonl

Fine-tune pretrained weights: point the model at a Hugging Face directory (Llama 2/3,
Qwen2, ...; config.json sets the shapes and the vocabulary) with these overrides, or write
``model = LazyCall(load_huggingface)(path=...)`` in a copy of this file (under pipeline
parallelism also set ``train.dist.pipeline_num_layers`` to the checkpoint's layer count)::

    model._target_=libai.models.utils.load_huggingface +model.path=/models/Llama-3.2-1B \\
        ~model.cfg tokenization.setup=False
"""

from .common.data.sft_dataset import dataloader, tokenization
from .common.models.graph import graph
from .common.models.llama import cfg, model
from .common.optim import optim
from .common.train import train

cfg.hidden_layers = 4
cfg.hidden_size = 256
cfg.intermediate_size = 688
cfg.num_attention_heads = 8
cfg.num_key_value_heads = 4
cfg.max_position_embeddings = 1024
cfg.rms_norm_eps = 1e-6
tokenization.setup = True  # vocab_size from the tokenizer

for ds in dataloader.train.dataset:
    ds.max_seq_length = 512

optim.lr = 2e-5
optim.weight_decay = 0.0

train.update(
    output_dir="output/llama_sft",
    train_epoch=3,
    train_iter=0,
    train_micro_batch_size=4,
    test_micro_batch_size=4,
    log_period=10,
    warmup_ratio=0.03,
)
train.checkpointer.update(period=500, max_to_keep=2)
train.evaluation.enabled = False  # set True with a dataloader.train.valid_dataset

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
