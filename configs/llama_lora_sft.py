"""LoRA fine-tuning (SFT) of a Llama-family causal LM: the data and loop of llama_sft.py,
with adapters (PEFT's field names) on every attention and MLP projection and the base
frozen::

    bash tools/train.sh tools/train_net.py configs/llama_lora_sft.py 2 \\
        model._target_=libai.models.utils.load_huggingface +model.path=/models/Llama-3.2-1B \\
        ~model.cfg tokenization.setup=False \\
        tokenization.tokenizer.tokenizer_file=/models/Llama-3.2-1B/tokenizer.json \\
        dataloader.train.dataset.0.data_path=/data/alpaca.jsonl

Any layout works (``train.dist.tensor_parallel_size=2``, pipeline stages, ZeRO): each
adapter is laid out with its base layer. Export the adapter as a PEFT directory, or the
merged model as a Hugging Face directory::

    python tools/convert_checkpoint.py to-peft --checkpoint output/llama_lora_sft/model_final \\
        --config-file output/llama_lora_sft/config.yaml --output lora-adapter
    python tools/convert_checkpoint.py to-hf --merge-lora --checkpoint ... --output merged-hf
"""

from .llama_sft import cfg, dataloader, graph, model, optim, tokenization, train

train.lora.update(
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    r=8,
    lora_alpha=16.0,
    lora_dropout=0.05,
)
optim.lr = 2e-4  # adapters learn at LoRA's usual rates
train.output_dir = "output/llama_lora_sft"

__all__ = ["cfg", "dataloader", "tokenization", "model", "graph", "optim", "train"]
