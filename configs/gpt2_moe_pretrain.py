"""GPT-2 pretraining with Mixture-of-Experts blocks (the sample data of gpt2_pretrain.py).

Every second block's MLP becomes 8 experts, each token routed to 2 of them (softmax top-2,
dropless), balanced by the Switch/GShard auxiliary loss and the router z-loss (logged as
``moe_aux_loss`` / ``moe_z_loss``). The experts split over data-parallel ranks with
``train.dist.expert_parallel_size``::

    bash tools/train.sh tools/train_net.py configs/gpt2_moe_pretrain.py 4 \\
        train.dist.expert_parallel_size=2

Capacity mode (GShard token dropping), DeepSeek-V3-style routing and more: the keys of
``libai.layers.MoEConfig`` under ``model.cfg.moe``, e.g. ``model.cfg.moe.capacity_factor=1.25``.
"""

from .gpt2_pretrain import cfg, dataloader, graph, model, optim, tokenization, train

cfg.moe = dict(
    num_experts=8,
    top_k=2,
    layer_freq=2,  # blocks 1, 3, ...: MoE; 0, 2, ...: dense
    aux_loss_coeff=1e-2,
    z_loss_coeff=1e-3,
)
train.output_dir = "output/gpt2_moe_pretrain"
train.dist.expert_parallel_size = 1

__all__ = ["dataloader", "tokenization", "model", "graph", "optim", "train"]
