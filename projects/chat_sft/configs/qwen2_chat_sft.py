"""Chat SFT of a Hugging Face Qwen2 / Llama chat checkpoint on ``messages`` conversations.

One directory gives the weights (``config.json`` + safetensors, loaded by
``libai.models.utils.load_huggingface`` into any tp / pp layout), the tokenizer
(``tokenizer.json``) and the chat template (``chat_template.jinja`` or ``tokenizer_config.json``;
the built-in ChatML when it has none)::

    bash tools/train.sh tools/train_net.py projects/chat_sft/configs/qwen2_chat_sft.py 4 \\
        model.path=/models/Qwen2-0.5B-Instruct \\
        dataloader.train.dataset.0.data_path=/data/chats.jsonl \\
        train.dist.tensor_parallel_size=2

Under pipeline parallelism also set ``train.dist.pipeline_num_layers`` to the checkpoint's
``num_hidden_layers``. Only assistant replies and their end-of-turn token are learned
(``projects/chat_sft/dataset.py``).
"""

from omegaconf import OmegaConf

from libai.config import LazyCall, get_config
from libai.data import build_nlp_test_loader, build_nlp_train_loader  # noqa: F401
from libai.models.utils import load_huggingface
from libai.tokenizer import JsonTokenizer
from projects.chat_sft.dataset import ChatSFTDataset

graph = get_config("common/models/graph.py").graph
optim = get_config("common/optim.py").optim
train = get_config("common/train.py").train

model = LazyCall(load_huggingface)(path="/path/to/Qwen2-0.5B-Instruct")

tokenization = OmegaConf.create()
# the checkpoint directory: tokenizer.json + tokenizer_config.json (special tokens, template)
tokenization.tokenizer = LazyCall(JsonTokenizer)(tokenizer_file="${model.path}")
tokenization.append_eod = False
tokenization.setup = False  # the vocabulary size is config.json's
tokenization.make_vocab_size_divisible_by = 128

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[
        LazyCall(ChatSFTDataset)(
            data_path="/path/to/train.jsonl",
            tokenizer="${tokenization.tokenizer}",
            max_seq_length=2048,
            # None: the checkpoint's template, else the built-in ChatML; "checkpoint": the
            # checkpoint's or an error; "chatml"; a .jinja file; or the template text
            chat_template=None,
            # None: the marker the template writes after a reply (<|im_end|>, <|eot_id|>)
            end_of_turn=None,
        ),
    ],
    # e.g. LazyCall(ChatSFTDataset)(data_path=..., tokenizer="${tokenization.tokenizer}", ...)
    # with train.evaluation.enabled=True: perplexity of the assistant tokens
    valid_dataset=None,
    num_workers=0,
)

optim.lr = 1e-5
optim.weight_decay = 0.0

train.update(
    output_dir="output/qwen2_chat_sft",
    train_epoch=2,
    train_iter=0,
    train_micro_batch_size=2,
    test_micro_batch_size=2,
    num_accumulation_steps=8,
    log_period=10,
    warmup_ratio=0.03,
)
train.checkpointer.update(period=500, max_to_keep=2)
train.evaluation.enabled = False

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
