"""Indexed datasets (mmap, and the older lazy / cached format), split strings and dataset
blending."""

from libai.data.data_utils.dataset_utils import (
    BlendableDataset,
    get_train_valid_test_split_,
    parse_splits,
)
from libai.data.data_utils.indexed_dataset import (
    DATASET_IMPLS,
    IndexedDataset,
    IndexedDatasetBuilder,
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    best_fitting_dtype,
    data_file_path,
    get_indexed_dataset,
    index_file_path,
    infer_dataset_impl,
    make_builder,
    make_dataset,
)

__all__ = [
    "BlendableDataset",
    "DATASET_IMPLS",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "MMapIndexedDataset",
    "MMapIndexedDatasetBuilder",
    "best_fitting_dtype",
    "data_file_path",
    "get_indexed_dataset",
    "get_train_valid_test_split_",
    "index_file_path",
    "infer_dataset_impl",
    "make_builder",
    "make_dataset",
    "parse_splits",
]
