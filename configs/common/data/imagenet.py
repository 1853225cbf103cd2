"""ImageNet classification data (ViT): a folder per class, PIL / numpy transforms.

The roots are placeholders for the usual layout ``train/<wnid>/*.JPEG`` and
``val/<wnid>/*.JPEG``; override::

    dataloader.train.dataset.0.root=/data/imagenet/train
    dataloader.train.valid_dataset.root=/data/imagenet/val
    dataloader.test.0.dataset.root=/data/imagenet/val

Training images get a random resized crop (scale 0.08-1, ratio 3/4-4/3) and a horizontal
flip, evaluation images a resize to ``image_size / 0.875`` and a center crop; both are
normalized with the ImageNet mean / std (see :mod:`libai.data.transforms`). Samples:
``images`` ``[3, image_size, image_size]`` float32 and ``labels`` (long).
"""

from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_image_test_loader, build_image_train_loader
from libai.data.datasets import ImageFolderDataset

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_image_train_loader)(
    dataset=[
        LazyCall(ImageFolderDataset)(
            root="/path/to/imagenet/train",
            train=True,
            image_size=224,
            seed=0,
        ),
    ],
    valid_dataset=LazyCall(ImageFolderDataset)(
        root="/path/to/imagenet/val",
        train=False,
        image_size=224,
    ),
    mixup_func=None,
    num_workers=4,
)
dataloader.test = [
    LazyCall(build_image_test_loader)(
        dataset=LazyCall(ImageFolderDataset)(
            root="/path/to/imagenet/val",
            train=False,
            image_size=224,
        ),
        num_workers=4,
    ),
]
