"""Instruction fine-tuning (SFT) of a Mixture-of-Experts causal LM: Mixtral, or Qwen2-MoE
(the data and training loop of llama_sft.py).

Out of the box a small random Mixtral (8 experts, top-2); fine-tune Hugging Face weights
(Mixtral-8x7B, Qwen1.5-MoE / Qwen2-57B-A14B, ...) by pointing the model at their directory,
with the experts split over data-parallel ranks::

    bash tools/train.sh tools/train_net.py configs/mixtral_sft.py 8 \\
        model._target_=libai.models.utils.load_huggingface +model.path=/models/Mixtral-8x7B \\
        ~model.cfg tokenization.setup=False \\
        tokenization.tokenizer.tokenizer_file=/models/Mixtral-8x7B/tokenizer.json \\
        dataloader.train.dataset.0.data_path=/data/alpaca.jsonl \\
        train.dist.expert_parallel_size=8 train.dist.device_type=cuda

Each rank then reads only its experts' tensors from the checkpoint. The load-balancing loss
is off when config.json has ``output_router_logits: false`` (transformers' default); turn it
on with ``+model.moe={num_experts:8,top_k:2,aux_loss_coeff:0.02}`` on a random model, or
``model.cfg.moe.aux_loss_coeff=0.02`` here.
"""

from .llama_sft import cfg, dataloader, graph, model, optim, tokenization, train

cfg.model_type = "mixtral"
cfg.intermediate_size = 512  # each expert's
cfg.moe = dict(num_experts=8, top_k=2, aux_loss_coeff=0.02)
train.output_dir = "output/mixtral_sft"
train.dist.expert_parallel_size = 1

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
