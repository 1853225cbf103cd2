"""Task datasets: GPT, BERT, RoBERTa and T5 pretraining over indexed datasets; SFT on JSON
lines; image classification on a folder per class."""

from libai.data.datasets.bert_dataset import BertDataset
from libai.data.datasets.gpt_dataset import GPT2Dataset
from libai.data.datasets.image_folder import ImageFolderDataset
from libai.data.datasets.roberta_dataset import RobertaDataset
from libai.data.datasets.sft_dataset import SFTDataset
from libai.data.datasets.t5_dataset import T5Dataset
from libai.data.datasets.t5_libai_dataset import LiBaiT5Dataset
from libai.data.datasets.text_classification import TextClassificationDataset

__all__ = [
    "BertDataset",
    "GPT2Dataset",
    "ImageFolderDataset",
    "LiBaiT5Dataset",
    "RobertaDataset",
    "SFTDataset",
    "T5Dataset",
    "TextClassificationDataset",
]
