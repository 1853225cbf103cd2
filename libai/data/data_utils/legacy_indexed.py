"""The older indexed-dataset format (Megatron / fairseq ``IndexedDataset``, magic
``TNTIDX``), which LiBai's ``--dataset-impl lazy`` and ``cached`` name.

``.idx`` layout (little endian)::

    magic        b"TNTIDX\\x00\\x00"
    version      uint64 = 1
    dtype code   uint64 (:data:`LEGACY_DTYPES`), element size uint64
    items        uint64 (n), number of sizes uint64 (s)
    doc entries  uint64 (d)
    dim_offsets  int64[n + 1]   data_offsets int64[n + 1] (in elements)
    sizes        int64[s]       doc_idx      int64[d]

``.bin`` holds the items' values back to back. ``lazy`` reads an item from the file when it is
asked for; ``cached`` reads the whole ``.bin`` once. Both expose what the datasets use of the
mmap format: ``len``, ``[i]``, ``get(i, offset, length)``, ``sizes``, ``doc_idx``, ``dtype``.
"""

from __future__ import annotations

import os
import struct

import numpy as np

__all__ = ["LEGACY_MAGIC", "IndexedDataset", "IndexedDatasetBuilder"]

LEGACY_MAGIC = b"TNTIDX\x00\x00"

#: the format's dtype codes (LiBai's / fairseq's table)
LEGACY_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float32,
    7: np.float64,
    8: np.uint16,
}


def _code(dtype) -> int:
    for code, candidate in LEGACY_DTYPES.items():
        if np.dtype(candidate) == np.dtype(dtype):
            return code
    raise ValueError(f"dtype {np.dtype(dtype).name} cannot be stored in a {LEGACY_MAGIC!r} dataset")


class IndexedDataset:
    """Read a ``TNTIDX`` dataset at ``path`` (prefix of ``.idx`` / ``.bin``); ``cached``
    holds the whole ``.bin`` in memory after the first read."""

    def __init__(self, path: str, cached: bool = False):
        self.path, self.cached = os.fspath(path), cached
        self._data = None
        with open(self.path + ".idx", "rb") as f:
            magic = f.read(8)
            if magic != LEGACY_MAGIC:
                raise ValueError(
                    f"{self.path}.idx is not a {LEGACY_MAGIC!r} (lazy / cached) dataset "
                    f"(starts with {magic!r}); open it with data_impl='mmap' or 'infer'"
                )
            (version,) = struct.unpack("<Q", f.read(8))
            if version != 1:
                raise ValueError(f"{self.path}.idx: version {version}, expected 1")
            code, self.element_size = struct.unpack("<QQ", f.read(16))
            if code not in LEGACY_DTYPES:
                raise ValueError(f"{self.path}.idx: unknown dtype code {code}")
            self.dtype = LEGACY_DTYPES[code]
            self._len, num_sizes = struct.unpack("<QQ", f.read(16))
            (num_docs,) = struct.unpack("<Q", f.read(8))
            self.dim_offsets = np.fromfile(f, np.int64, self._len + 1)
            self.data_offsets = np.fromfile(f, np.int64, self._len + 1)
            self._sizes = np.fromfile(f, np.int64, num_sizes)
            self._doc_idx = np.fromfile(f, np.int64, num_docs)
        if len(self._doc_idx) != num_docs or len(self._sizes) != num_sizes:
            raise ValueError(f"{self.path}.idx is cut short ({num_sizes} sizes announced)")
        # one size per item (token sequences are 1-D)
        self.item_sizes = np.diff(self.data_offsets).astype(np.int64)

    def __len__(self) -> int:
        return int(self._len)

    @property
    def sizes(self) -> np.ndarray:
        return self.item_sizes

    @property
    def doc_idx(self) -> np.ndarray:
        return self._doc_idx

    def _read(self, start: int, count: int) -> np.ndarray:
        if self.cached:
            if self._data is None:
                self._data = np.fromfile(self.path + ".bin", dtype=self.dtype)
            return self._data[start : start + count].copy()
        out = np.empty(count, dtype=self.dtype)
        with open(self.path + ".bin", "rb", buffering=0) as f:
            f.seek(start * self.element_size)
            f.readinto(out)
        return out

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Item ``idx`` from ``offset``, ``length`` values (to its end when None)."""
        if not 0 <= idx < self._len:
            raise IndexError(f"index {idx} out of range for {self._len} items")
        size = int(self.item_sizes[idx])
        length = size - offset if length is None else length
        return self._read(int(self.data_offsets[idx]) + offset, length)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self.get(i) for i in range(*idx.indices(self._len))]
        return self.get(int(idx))


class IndexedDatasetBuilder:
    """Write a ``TNTIDX`` dataset: ``add_item`` per sequence, ``end_document``, ``finalize``
    (int32 values by default, as LiBai's builder)."""

    def __init__(self, out_file: str, dtype=np.int32):
        _code(dtype)
        self.dtype = np.dtype(dtype)
        self._file = open(os.fspath(out_file), "wb")  # closed by finalize()
        self.data_offsets, self.dim_offsets, self.sizes, self.doc_idx = [0], [0], [], [0]

    def add_item(self, tensor) -> None:
        array = np.ascontiguousarray(np.asarray(tensor), dtype=self.dtype).reshape(-1)
        self._file.write(array.tobytes())
        self.data_offsets.append(self.data_offsets[-1] + array.size)
        self.sizes.append(array.size)
        self.dim_offsets.append(self.dim_offsets[-1] + 1)

    def end_document(self) -> None:
        self.doc_idx.append(len(self.sizes))

    def close(self) -> None:
        self._file.close()

    def finalize(self, index_file: str) -> None:
        self.close()
        with open(index_file, "wb") as f:
            f.write(LEGACY_MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<QQ", _code(self.dtype), self.dtype.itemsize))
            f.write(struct.pack("<QQ", len(self.data_offsets) - 1, len(self.sizes)))
            f.write(struct.pack("<Q", len(self.doc_idx)))
            for values in (self.dim_offsets, self.data_offsets, self.sizes, self.doc_idx):
                f.write(np.asarray(values, dtype=np.int64).tobytes())
