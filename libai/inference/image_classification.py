"""``ImageClassificationPipeline``: label scores of images from a ``VisionTransformer``,
shaped like ``transformers.pipeline("image-classification")``.

Preprocessing mirrors ``transformers``' ``ViTImageProcessor`` (PIL backend): RGB, resize
(bilinear) to the model's size, rescale by 1/255, normalize by mean/std, channels first;
the values come from ``preprocessor_config.json`` next to the weights when present.

Usage (every rank runs the same script; rank 0 gets the result, the others ``None``)::

    pipe = ImageClassificationPipeline(model_path="path/to/hf_vit", mode="huggingface")
    pipe(Image.open("cat.png"), top_k=3)   # [{"label": "tabby", "score": 0.7}, ...]
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from libai.config import try_get_key
from libai.inference.basic import BasePipeline
from libai.inference.classification_utils import (
    apply_function,
    check_function,
    check_top_k,
    default_function,
    id2label,
    ranked_labels,
)

PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: ViTImageProcessor's defaults (IMAGENET_STANDARD mean / std, PIL bilinear)
DEFAULTS = dict(
    do_resize=True,
    resample=2,
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)


def to_pil_image(image):
    """A ``PIL.Image`` in RGB from a PIL image, a file path or a ``uint8`` numpy array
    (``HxW``, ``HxWxC`` or ``CxHxW``)."""
    from PIL import Image, ImageOps

    if isinstance(image, (str, os.PathLike)):
        if not os.path.isfile(image):
            raise FileNotFoundError(f"image file {image} does not exist")
        image = Image.open(image)
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise TypeError(f"numpy images must be uint8 (0..255), got {image.dtype}")
        if image.ndim == 3 and image.shape[0] in (1, 3, 4) and image.shape[-1] not in (1, 3, 4):
            image = np.moveaxis(image, 0, -1)  # CxHxW -> HxWxC
        image = Image.fromarray(
            image.squeeze(-1) if image.ndim == 3 and image.shape[-1] == 1 else image
        )
    elif not isinstance(image, Image.Image):
        raise TypeError(
            f"expected a PIL image, a numpy uint8 array or a file path, got {type(image).__name__}"
        )
    return ImageOps.exif_transpose(image).convert("RGB")


class ImageClassificationPipeline(BasePipeline):
    """Classify images. Call parameters: ``top_k`` (default 5, at most the number of labels)
    and ``function_to_apply`` (``"softmax"`` / ``"sigmoid"`` / ``"none"``; default from
    ``config.json``). Each image gives a ranked list of ``{"label", "score"}``; labels come
    from ``config.json``'s ``id2label`` (``LABEL_{i}`` without one)."""

    needs_tokenizer = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.image_processing = self._image_processing()

    def _image_processing(self) -> dict:
        """ViTImageProcessor settings: defaults, the model's image size, then the model
        directory's ``preprocessor_config.json``."""
        img_size = None if self.cfg is None else try_get_key(self.cfg, "model.cfg.img_size")
        side = self.hf_config.get("image_size") or img_size or 224
        settings = {**DEFAULTS, "size": {"height": int(side), "width": int(side)}}
        path = os.path.join(self.model_path or "", PREPROCESSOR_CONFIG)
        if self.model_path and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            settings.update({k: saved[k] for k in (*DEFAULTS, "size") if k in saved})
        size = settings["size"]
        if "shortest_edge" in size:
            raise ValueError(
                f"{path}: size={size} (shortest_edge) is not supported; use height/width"
            )
        return settings

    def _parse_parameters(self, **params):
        pre, fwd, post = self.split_parameters(params, postprocess=("top_k", "function_to_apply"))
        if "top_k" in post:
            check_top_k(post["top_k"])
        if "function_to_apply" in post:
            post["function_to_apply"] = check_function(post["function_to_apply"])
        return pre, fwd, post

    def pixel_values(self, image) -> np.ndarray:
        """One image -> ``[3, height, width]`` float32, as ViTImageProcessor computes it."""
        s = self.image_processing
        image = to_pil_image(image)
        if s["do_resize"]:
            image = image.resize((s["size"]["width"], s["size"]["height"]), resample=s["resample"])
        pixels = np.asarray(image)
        if s["do_rescale"]:
            pixels = (pixels.astype(np.float64) * s["rescale_factor"]).astype(np.float32)
        pixels = pixels.astype(np.float32)
        if s["do_normalize"]:
            mean = np.asarray(s["image_mean"], dtype=np.float32)
            std = np.asarray(s["image_std"], dtype=np.float32)
            pixels = (pixels - mean) / std
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))

    def preprocess(self, inputs: list, **params) -> dict:
        images = np.stack([self.pixel_values(image) for image in inputs])
        return {"images": torch.from_numpy(images).to(self.device)}

    def forward(self, model_inputs: dict, **params):
        logits = self.run_model(model_inputs)  # the head is replicated: full logits
        return None if logits is None else logits.float().cpu()

    def postprocess(self, logits: torch.Tensor, top_k: int = 5, function_to_apply=None) -> list:
        num_labels = logits.shape[-1]
        function = function_to_apply or default_function(self.hf_config, num_labels)
        labels = id2label(self.hf_config, num_labels)
        return [
            ranked_labels(apply_function(row, function), labels, min(top_k, num_labels))
            for row in logits.numpy()
        ]
