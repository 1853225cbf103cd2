"""A first run: a small random Qwen2 (libai's ``LlamaForCausalLM`` with ``model_type="qwen2"``)
learns the sample arithmetic chats in a few minutes on CPU, no download needed::

    python projects/chat_sft/sample_data.py output/chat_sample
    python tools/train_net.py --config-file projects/chat_sft/configs/qwen2_chat_sft_tiny.py
    python projects/chat_sft/chat.py output/chat_sft_tiny "What is 2 plus 3?"

Same data pipeline as ``qwen2_chat_sft.py``; the vocabulary size comes from the tokenizer
(``tokenization.setup``). Point ``tokenization.tokenizer.tokenizer_file`` and the data paths
elsewhere to train it on your own chats.
"""

from libai.config import LazyCall, get_config
from libai.models import LlamaForCausalLM
from projects.chat_sft.dataset import ChatSFTDataset

from .qwen2_chat_sft import dataloader, graph, optim, tokenization, train

SAMPLE = "output/chat_sample"

model = LazyCall(LlamaForCausalLM)(cfg=get_config("common/models/llama.py").model.cfg)
model.cfg.update(
    model_type="qwen2",
    qkv_bias=True,
    hidden_layers=2,
    vocab_size=512,  # replaced by the tokenizer's (padded) size
    hidden_size=128,
    intermediate_size=352,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
)

tokenization.tokenizer.tokenizer_file = f"{SAMPLE}/tokenizer"
tokenization.setup = True

train_set = dataloader.train.dataset[0]
train_set.update(data_path=f"{SAMPLE}/train.jsonl", max_seq_length=96)
dataloader.train.valid_dataset = LazyCall(ChatSFTDataset)(
    data_path=f"{SAMPLE}/valid.jsonl",
    tokenizer="${tokenization.tokenizer}",
    max_seq_length="${dataloader.train.dataset.0.max_seq_length}",
    chat_template="${dataloader.train.dataset.0.chat_template}",
    end_of_turn="${dataloader.train.dataset.0.end_of_turn}",
)

optim.lr = 2e-3
optim.weight_decay = 0.01

train.update(
    output_dir="output/chat_sft_tiny",
    train_epoch=0,
    train_iter=300,
    train_micro_batch_size=16,
    test_micro_batch_size=16,
    num_accumulation_steps=1,
    log_period=20,
    warmup_ratio=0.05,
)
train.checkpointer.update(period=300, max_to_keep=1)
train.evaluation.update(enabled=True, eval_period=100, eval_iter=2)

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
