"""ViT-B/16 image classification on ImageNet (LiBai's config shape).

Point the ImageFolder datasets at the data (a folder per class) and train, e.g.

    bash tools/train.sh tools/train_net.py configs/vit_imagenet.py 8 \\
        dataloader.train.dataset.0.root=/data/imagenet/train \\
        dataloader.train.valid_dataset.root=/data/imagenet/val \\
        dataloader.test.0.dataset.root=/data/imagenet/val \\
        train.dist.device_type=cuda train.dist.tensor_parallel_size=2 train.amp.enabled=True

Evaluation reports top-1 / top-5 accuracy; ``model_best`` tracks Acc@1. Smaller models and
images are overrides alone (``model.cfg.img_size`` must equal the datasets' ``image_size``).
"""

from libai.config import LazyCall

from .common.data.imagenet import dataloader
from .common.models.graph import graph
from .common.models.vit import cfg, model
from .common.optim import optim
from .common.train import train

cfg.num_classes = 1000

# DeiT's recipe for ViT-B/16 (without mixup / stochastic depth), 5e-4 per 512 images
optim.lr = 1e-3
optim.weight_decay = 0.05
optim.params.clip_grad_max_norm = None

train.update(
    output_dir="output/vit_imagenet",
    train_micro_batch_size=128,
    test_micro_batch_size=128,
    train_epoch=300,
    warmup_ratio=5 / 300,
    log_period=20,
)
train.checkpointer.update(period=5000, max_to_keep=3)
train.evaluation.update(
    evaluator=LazyCall("libai.evaluation.ClsEvaluator")(topk=(1, 5)),
    eval_period=5000,
    eval_metric="Acc@1",
    eval_mode="max",
)

__all__ = ["dataloader", "model", "graph", "optim", "train"]
