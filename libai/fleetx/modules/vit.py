"""ViT image classification as a task module: ``Model.module: ImageClassificationModule``."""

from __future__ import annotations

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import AccuracyModule
from libai.models import VisionTransformer

__all__ = ["ImageClassificationModule"]


class ImageClassificationModule(AccuracyModule):
    """:class:`~libai.models.VisionTransformer` on ``{"images", "labels"}`` batches
    (``Data.*.dataset.name: ImageFolderDataset``, with ``train: true`` for the training
    split's augmentation); evaluation reports the loss and accuracy.

    ``Model`` keys: ViT's hyper-parameters (``img_size``, ``patch_size``, ``embed_dim``,
    ``depth``, ``num_heads``, ``num_classes``, ...), or ``pretrained`` (a Hugging Face ViT
    directory) with ``num_classes`` for a new head.
    """

    model_class = VisionTransformer

    def input_spec(self):
        size, chans = self.model.embeddings.img_size, self.model.embeddings.in_chans
        return [InputSpec([None, chans, size, size], "float32", "images")]
