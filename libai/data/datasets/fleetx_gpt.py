"""PaddleFleetX's GPT data format: ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` under an
``input_dir``, and the samples FleetX's ``GPTDataset`` cuts from it.

The format (what FleetX's ``ppfleetx/data/data_tools/gpt/preprocess_data.py`` writes):

- ``<prefix>_ids.npy``: every token id of the corpus, concatenated (``uint16`` when the
  vocabulary fits, else ``int32``);
- ``<prefix>_idx.npz``: ``lens`` (``int32``, the length of each item: a document, or a
  sentence with sentence splitting) and ``docs`` (``int64``, cumulative item counts at each
  document boundary, starting at 0). FleetX's dataset reads ``lens`` only: each entry of
  ``lens`` is one "document" of the train / valid / test split.

An older layout, one ``<prefix>_ids.npz`` holding ``ids`` and ``lens``, is read too.

Samples: the items of the ``mode`` split (``split: [949, 50, 1]`` weights, rounded as
Megatron does), repeated for as many epochs as ``num_samples`` needs and shuffled with
``seed``; sample ``i`` is ``max_seq_len + 1`` consecutive tokens of that sequence
(:func:`~libai.data.datasets.gpt_dataset.build_index_mappings`, the same rules), served in
a seeded shuffled order: ``dataset[i]`` is FleetX's ``dataset[i]`` for every ``i <
num_samples``. ``len(dataset)`` is ``num_samples`` (FleetX serves every sample of the epochs
it built, a few more; the Engine sizes its evaluation and its data-parallel shards by
``num_samples``), one epoch when ``None``. ``dataset[i]`` is FleetX's list
``[tokens, position_ids, labels, loss_mask]`` (``Test``: ``[tokens, position_ids]``) of
numpy arrays. FleetX's ``loss_mask`` is all ones: its ``tokens == eos_id`` compares a
Python list with a number, which is ``False`` and masks nothing; the same mask is served
here, so losses match FleetX's runs.

:func:`gpt_collate_fn` (FleetX's name, ``loader.collate_fn: gpt_collate_fn``) stacks a
batch into the libai model contract: ``{"input_ids", "position_ids", "labels",
"loss_mask"}`` tensors.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from libai.data.data_utils.dataset_utils import get_train_valid_test_split_
from libai.data.datasets.gpt_dataset import build_index_mappings

logger = logging.getLogger(__name__)

__all__ = [
    "FleetXGPTDataset",
    "convert_to_fleetx",
    "FleetXTokenFile",
    "find_fleetx_prefix",
    "fold_loss_mask",
    "gpt_collate_fn",
]

MODES = ("Train", "Eval", "Test")
#: the batch keys of FleetX's sample fields, in FleetX's order
FIELDS = ("input_ids", "position_ids", "labels", "loss_mask")


def find_fleetx_prefix(input_dir: str) -> str:
    """The corpus prefix in ``input_dir`` as FleetX picks it: the first (sorted)
    ``*_idx.npz``'s prefix, else the first ``*_ids.npz`` (the older layout)."""
    if os.path.isfile(input_dir):
        raise ValueError(
            f"GPTDataset input_dir={input_dir} is a file; FleetX's format is a directory holding "
            "<prefix>_ids.npy and <prefix>_idx.npz (written by preprocess_data.py)"
        )
    if not os.path.isdir(input_dir):
        raise FileNotFoundError(f"GPTDataset input_dir={input_dir} does not exist")
    names = sorted(os.listdir(input_dir))
    for suffix in ("_idx.npz", "_ids.npz"):
        found = [n for n in names if n.endswith(suffix)]
        if found:
            return os.path.join(input_dir, found[0][: -len(suffix)])
    raise FileNotFoundError(
        f"GPTDataset input_dir={input_dir} holds no <prefix>_idx.npz (nor the older "
        "<prefix>_ids.npz): write the corpus with FleetX's preprocess_data.py or "
        "tools/preprocess_data.py --output-format fleetx"
    )


class FleetXTokenFile:
    """One FleetX corpus read as an indexed dataset: ``sizes`` (the ``lens`` of its items)
    and ``get(i, offset, length)``, over the memory-mapped ``_ids.npy``."""

    def __init__(self, prefix: str):
        legacy = prefix + "_ids.npz"
        if not os.path.isfile(prefix + "_idx.npz") and os.path.isfile(legacy):
            data = np.load(legacy, allow_pickle=False)
            self.ids, self.sizes = data["ids"], data["lens"].astype(np.int32)
        else:
            for suffix in ("_ids.npy", "_idx.npz"):
                if not os.path.isfile(prefix + suffix):
                    raise FileNotFoundError(f"GPTDataset: {prefix + suffix} is missing")
            self.ids = np.load(prefix + "_ids.npy", mmap_mode="r", allow_pickle=False)
            with np.load(prefix + "_idx.npz", allow_pickle=False) as index:
                self.sizes = np.asarray(index["lens"])
        self.prefix = prefix
        self.starts = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.starts[1:])
        if self.starts[-1] != len(self.ids):
            raise ValueError(
                f"GPTDataset: {prefix}: the lens sum to {self.starts[-1]} tokens but the ids "
                f"hold {len(self.ids)}; the two files are not one corpus"
            )

    def __len__(self) -> int:
        return len(self.sizes)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        start = int(self.starts[idx]) + offset
        end = int(self.starts[idx + 1]) if length is None else start + length
        return np.asarray(self.ids[start:end])


class FleetXGPTDataset(torch.utils.data.Dataset):
    """FleetX's ``GPTDataset`` over ``input_dir`` (see the module doc).

    Args:
        input_dir: the directory holding ``<prefix>_ids.npy`` / ``<prefix>_idx.npz``.
        split: train / valid / test weights of the items (``[949, 50, 1]``).
        max_seq_len: tokens per sample (inputs and labels are each this long).
        num_samples: samples needed (FleetX: ``global_batch_size x max_steps`` for Train);
            ``None`` = one epoch of the split.
        mode: ``Train``, ``Eval`` or ``Test``.
        seed: seed of the item and sample shuffles (FleetX: ``Global.seed``).
        model_type: FleetX's tokenizer family (``GPT``); accepted and unused.
    """

    def __init__(
        self,
        input_dir: str,
        split=(949, 50, 1),
        max_seq_len: int = 1024,
        num_samples: int | None = None,
        mode: str = "Train",
        seed: int = 1234,
        model_type: str = "GPT",
    ):
        if mode not in MODES:
            raise ValueError(f"GPTDataset mode must be one of {MODES}, got {mode!r}")
        self.tokens = FleetXTokenFile(find_fleetx_prefix(str(input_dir)))
        self.mode, self.max_seq_len = mode, int(max_seq_len)
        bounds = get_train_valid_test_split_(len(self.tokens), list(split))
        index = MODES.index(mode)
        documents = np.arange(bounds[index], bounds[index + 1])
        if len(documents) == 0:
            raise ValueError(
                f"GPTDataset: the {mode} split {list(split)} of {self.tokens.prefix} "
                f"({len(self.tokens)} items) is empty; give it a larger share or more data"
            )
        self.doc_idx, self.sample_idx, self.shuffle_idx = build_index_mappings(
            name=f"gpt_{mode}",
            documents=documents,
            sizes=self.tokens.sizes,
            num_samples=num_samples,
            seq_length=self.max_seq_len,
            seed=int(seed),
        )
        logger.info(
            "GPTDataset %s: %d items of %s, %d samples of %d tokens",
            mode,
            len(documents),
            self.tokens.prefix,
            len(self),
            self.max_seq_len,
        )

    def __len__(self) -> int:
        return len(self.shuffle_idx)

    def sample_tokens(self, index: int) -> np.ndarray:
        """The ``max_seq_len + 1`` token ids of (shuffled) sample ``index``."""
        idx = int(self.shuffle_idx[index])
        doc_f, offset_f = (int(x) for x in self.sample_idx[idx])
        doc_l, offset_l = (int(x) for x in self.sample_idx[idx + 1])
        get = self.tokens.get
        if doc_f == doc_l:
            return get(int(self.doc_idx[doc_f]), offset_f, offset_l - offset_f + 1)
        parts = [get(int(self.doc_idx[doc_f]), offset_f)]
        parts += [get(int(self.doc_idx[k])) for k in range(doc_f + 1, doc_l)]
        parts.append(get(int(self.doc_idx[doc_l]), 0, offset_l + 1))
        return np.concatenate(parts)

    def __getitem__(self, index: int) -> list[np.ndarray]:
        tokens = self.sample_tokens(index).astype(np.int64)
        inputs, labels = tokens[:-1], tokens[1:]
        position_ids = np.arange(len(inputs), dtype=np.int64)
        if self.mode == "Test":
            return [inputs, position_ids]
        return [inputs, position_ids, labels, np.ones(len(inputs), dtype=np.float32)]


def gpt_collate_fn(batch: list) -> dict[str, torch.Tensor]:
    """FleetX's ``gpt_collate_fn``: stack each field of the samples; returned by name
    (``input_ids``, ``position_ids``, ``labels``, ``loss_mask``; the first two for
    ``Test`` samples), the batch the libai model contract takes."""
    if not batch:
        raise ValueError("gpt_collate_fn: cannot collate an empty batch")
    widths = {len(sample) for sample in batch}
    if len(widths) != 1 or next(iter(widths)) > len(FIELDS):
        raise ValueError(
            f"gpt_collate_fn: samples must be FleetX GPT samples of one width (at most "
            f"{len(FIELDS)} fields: {', '.join(FIELDS)}), got widths {sorted(widths)}"
        )
    return {
        name: torch.as_tensor(np.stack([np.asarray(sample[i]) for sample in batch]))
        for i, name in enumerate(FIELDS[: len(batch[0])])
    }


def fold_loss_mask(batch, ignore_index: int = -100):
    """A batch with ``loss_mask`` as the model contract takes it: labels at mask 0 set to
    ``ignore_index`` and the mask dropped (the mean over the kept targets is FleetX's
    ``sum(loss * mask) / sum(mask)``). Other batches are returned unchanged."""
    if not isinstance(batch, dict) or "loss_mask" not in batch:
        return batch
    batch = dict(batch)
    mask = batch.pop("loss_mask")
    if "labels" in batch:
        batch["labels"] = batch["labels"].masked_fill(mask == 0, ignore_index)
    return batch


def convert_to_fleetx(data_prefix: str, output_prefix: str | None = None) -> str:
    """Write the indexed dataset at ``data_prefix`` (``.bin`` / ``.idx``) in FleetX's format,
    ``<output_prefix>_ids.npy`` + ``<output_prefix>_idx.npz`` (default ``output_prefix``:
    ``data_prefix``), as FleetX's preprocess_data.py writes it: the ids concatenated
    (``uint16`` when they fit, else ``int32``), ``lens`` (int32, one per item) and ``docs``
    (int64, the item count at each document boundary from 0). Returns ``output_prefix``."""
    from libai.data.data_utils.indexed_dataset import MMapIndexedDataset

    output_prefix = output_prefix or data_prefix
    data = MMapIndexedDataset(data_prefix, skip_warmup=True)
    sizes = np.asarray(data.sizes, dtype=np.int64)
    items = [data.get(i) for i in range(len(data))]
    ids = np.concatenate(items) if items else np.zeros(0, dtype=np.int32)
    small = ids.size == 0 or int(ids.max()) < np.iinfo(np.uint16).max
    np.save(output_prefix + "_ids.npy", ids.astype(np.uint16 if small else np.int32))
    np.savez(
        output_prefix + "_idx.npz",
        lens=sizes.astype(np.int32),
        docs=np.asarray(data.doc_idx, dtype=np.int64),
    )
    return output_prefix
