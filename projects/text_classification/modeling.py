"""The classifier of ``configs/config_hf.py``: libai's ``BertForClassification`` filled from a
Hugging Face BERT directory.

``configs/config.py`` builds ``BertForClassification`` directly from its ``model.cfg``
(random weights). Fine-tuning starts from a pretrained checkpoint instead: the shapes come
from its ``config.json``, the backbone weights from its safetensors (each rank reading only
its own shards), and the classifier head starts fresh unless the checkpoint is already a
``BertForSequenceClassification`` with as many labels.
"""

from __future__ import annotations

import os

from libai.models import BertForClassification
from libai.models.utils import load_huggingface


def bert_classifier_from_hf(path: str, cfg: dict | None = None) -> BertForClassification:
    """``BertForClassification`` with the weights of the Hugging Face directory ``path``.

    Args:
        path: a Hugging Face BERT directory (``config.json`` and ``*.safetensors``), e.g. a
            download of ``bert-base-uncased``.
        cfg: libai hyper-parameters that override ``config.json``'s: ``num_labels``,
            ``classifier_dropout``, ``hidden_dropout_prob``, ... (shape keys must agree with
            the checkpoint).

    Raises:
        FileNotFoundError: ``path`` is not a directory (the message names the config key).
        libai.models.utils.CheckpointError: ``path`` holds no (readable) checkpoint.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model.path={path!r} is not a directory: set model.path to a Hugging Face BERT "
            "directory (config.json, model.safetensors, vocab.txt), e.g. a download of "
            "bert-base-uncased."
        )
    return load_huggingface(path, BertForClassification, **dict(cfg or {}))
