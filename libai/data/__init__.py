"""Data: Megatron indexed datasets, task datasets (GPT, BERT, RoBERTa, T5, SFT, images),
resumable samplers and loader builders.

``from libai.data import build_nlp_train_val_test_loader`` is the entry point of configs
(see ``configs/common/data/gpt_dataset.py``); ``tools/preprocess_data.py`` writes the
``.bin`` / ``.idx`` files, and :mod:`libai.data.sample_corpus` builds a small offline sample.

Names are imported on first use, so the torch-free parts (indexed datasets, preprocessing)
load without importing torch.
"""

import importlib

_EXPORTS = {
    "build_image_test_loader": "libai.data.build",
    "build_image_train_loader": "libai.data.build",
    "build_nlp_test_loader": "libai.data.build",
    "build_nlp_train_loader": "libai.data.build",
    "build_nlp_train_val_test_loader": "libai.data.build",
    "build_train_valid_test_datasets": "libai.data.build",
    "trivial_batch_collator": "libai.data.build",
    "MMapIndexedDataset": "libai.data.data_utils.indexed_dataset",
    "MMapIndexedDatasetBuilder": "libai.data.data_utils.indexed_dataset",
    "get_indexed_dataset": "libai.data.data_utils.indexed_dataset",
    "BertDataset": "libai.data.datasets.bert_dataset",
    "GPT2Dataset": "libai.data.datasets.gpt_dataset",
    "ImageFolderDataset": "libai.data.datasets.image_folder",
    "ImageNetDataset": "libai.data.datasets.imagenet",
    "CIFAR10Dataset": "libai.data.datasets.cifar",
    "CIFAR100Dataset": "libai.data.datasets.cifar",
    "Mixup": "libai.data.mixup",
    "RobertaDataset": "libai.data.datasets.roberta_dataset",
    "SFTDataset": "libai.data.datasets.sft_dataset",
    "T5Dataset": "libai.data.datasets.t5_dataset",
    "TextClassificationDataset": "libai.data.datasets.text_classification",
    "CyclicSampler": "libai.data.samplers",
    "SingleRoundSampler": "libai.data.samplers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'libai.data' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
