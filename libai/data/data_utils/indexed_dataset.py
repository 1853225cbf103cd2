"""Megatron-LM's memory-mapped indexed dataset: a ``.bin`` of token ids plus an ``.idx`` index.

The files are byte-compatible with Megatron-LM's ``MMapIndexedDataset`` (and LiBai's), so
datasets preprocessed by either tool load here and vice versa.

``PREFIX.bin`` holds the token ids of every sequence back to back, in one integer dtype.
``PREFIX.idx`` is, little-endian::

    b"MMIDIDX\\x00\\x00"        9 bytes   magic
    version                     uint64    always 1
    dtype code                  uint8     see :data:`DTYPES`
    number of sequences N       uint64
    number of doc_idx entries D uint64
    sizes                       int32[N]  tokens per sequence
    pointers                    int64[N]  byte offset of each sequence in the .bin
    doc_idx                     int64[D]  sequence index where each document starts, plus N

For GPT pretraining every document is one sequence, so ``doc_idx == [0, 1, ..., N]``.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct

import numpy as np

from libai.data.data_utils.legacy_indexed import (
    LEGACY_MAGIC,
    IndexedDataset,
    IndexedDatasetBuilder,
)

logger = logging.getLogger(__name__)

_HDR_MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
# magic (9) + version (8) + dtype code (1) + number of sizes (8) + number of doc_idx entries (8)
_HEADER_BYTES = 9 + 8 + 1 + 8 + 8

#: dtype codes of the ``.idx`` header (Megatron-core's ``DType`` enum).
DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}

_PREPROCESS_CMD = (
    "`python tools/preprocess_data.py --input CORPUS.jsonl --json-keys text "
    "--tokenizer-name GPT2Tokenizer --vocab-file VOCAB --merges-file MERGES --append-eod "
    "--output-prefix PREFIX`"
)
_PREPROCESS_HINT = f"Rebuild it with {_PREPROCESS_CMD}."


def dtype_code(dtype) -> int:
    """The ``.idx`` header code of a numpy dtype."""
    dtype = np.dtype(dtype)
    for code, candidate in DTYPES.items():
        if np.dtype(candidate) == dtype:
            return code
    raise ValueError(f"dtype {dtype} cannot be stored in an indexed dataset; use one of {DTYPES}.")


def best_fitting_dtype(vocab_size: int | None = None):
    """Smallest dtype that holds every token id: ``uint16`` below 65500 ids, else ``int32``."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def index_file_path(prefix_path: str) -> str:
    return prefix_path + ".idx"


def data_file_path(prefix_path: str) -> str:
    return prefix_path + ".bin"


def _warmup_mmap_file(path: str) -> None:
    """Read the file once so its pages are in the OS cache before training starts."""
    with open(path, "rb") as stream:
        while stream.read(100 * 1024 * 1024):
            pass


#: the fields of the ``.idx`` header, in order: (name, bytes)
_HEADER_FIELDS = (
    ("magic", len(_HDR_MAGIC)),
    ("version", 8),
    ("dtype code", 1),
    ("sequence count", 8),
    ("document count", 8),
)


def _check_header(path: str, header: bytes) -> None:
    """Raise a one-line ValueError naming ``path`` if ``header`` (the first bytes read from an
    ``.idx`` file) does not start with the magic or ends before the header does."""
    magic = header[: len(_HDR_MAGIC)]
    if magic != _HDR_MAGIC[: len(magic)]:
        at = next(i for i, (a, b) in enumerate(zip(magic, _HDR_MAGIC)) if a != b)
        raise ValueError(
            f"{path} is not a Megatron mmap index file: its header starts with {magic!r} where "
            f"{_HDR_MAGIC!r} was expected (first difference at byte {at}: found "
            f"{magic[at : at + 1]!r}, expected {_HDR_MAGIC[at : at + 1]!r}). {_PREPROCESS_HINT}"
        )
    if len(header) == 0:
        raise ValueError(
            f"{path} is empty: an index file needs a {_HEADER_BYTES}-byte header. "
            f"{_PREPROCESS_HINT}"
        )
    start = 0
    for name, width in _HEADER_FIELDS:
        if len(header) < start + width:
            raise ValueError(
                f"{path} is truncated: its header ends after {len(header)} of {_HEADER_BYTES} "
                f"bytes, {len(header) - start} of {width} bytes into the {name} field (read "
                f"{header!r}). {_PREPROCESS_HINT}"
            )
        start += width


class _Index:
    """The parsed ``.idx`` file: dtype, ``sizes``, ``pointers`` and ``doc_idx`` (memory-mapped)."""

    def __init__(self, path: str, skip_warmup: bool = False):
        file_size = os.path.getsize(path)
        with open(path, "rb") as stream:
            header = stream.read(_HEADER_BYTES)
        _check_header(path, header)
        (version,) = struct.unpack("<Q", header[9:17])
        if version != _VERSION:
            raise ValueError(
                f"{path}: unsupported index version {version} (expected {_VERSION}); the index "
                f"file is corrupt or comes from another tool. {_PREPROCESS_HINT}"
            )
        (code,) = struct.unpack("<B", header[17:18])
        if code not in DTYPES:
            raise ValueError(
                f"{path}: unknown dtype code {code} in the header (known: "
                f"{sorted(DTYPES)}); the index file is corrupt. {_PREPROCESS_HINT}"
            )
        self.dtype = DTYPES[code]
        self.dtype_size = np.dtype(self.dtype).itemsize
        self._len, self._doc_count = struct.unpack("<QQ", header[18:34])
        expected = _HEADER_BYTES + self._len * (4 + 8) + self._doc_count * 8
        if file_size != expected:
            raise ValueError(
                f"{path} is {file_size} bytes but its header announces {self._len} sequences "
                f"and {self._doc_count} document boundaries ({expected} bytes): the index file "
                f"is truncated or corrupt ({self._where_it_ends(file_size)}). {_PREPROCESS_HINT}"
            )
        if not skip_warmup:
            _warmup_mmap_file(path)
        self._mmap = np.memmap(path, mode="r", order="C")
        buffer = memoryview(self._mmap)
        offset = _HEADER_BYTES
        self.sizes = np.frombuffer(buffer, dtype=np.int32, count=self._len, offset=offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(buffer, dtype=np.int64, count=self._len, offset=offset)
        offset += self.pointers.nbytes
        self.doc_idx = np.frombuffer(buffer, dtype=np.int64, count=self._doc_count, offset=offset)

    def _where_it_ends(self, file_size: int) -> str:
        """Which array of the index a file of ``file_size`` bytes ends in, in words."""
        end = _HEADER_BYTES
        for name, nbytes in (
            ("sizes", self._len * 4),
            ("pointers", self._len * 8),
            ("doc_idx", self._doc_count * 8),
        ):
            if file_size < end + nbytes:
                return f"it ends {file_size - end} of {nbytes} bytes into the {name} array"
            end += nbytes
        return f"{file_size - end} bytes follow the doc_idx array"

    def __len__(self) -> int:
        return self._len

    def expected_data_bytes(self) -> int:
        """Size the matching ``.bin`` must have: end of the last sequence."""
        if self._len == 0:
            return 0
        return int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype_size


class MMapIndexedDataset:
    """Read-only view of ``PREFIX.bin`` / ``PREFIX.idx``; ``ds[i]`` is sequence ``i`` as numpy.

    Args:
        path: the prefix, i.e. the file names without ``.bin`` / ``.idx``.
        skip_warmup: don't pre-read the files into the page cache.

    Raises:
        FileNotFoundError: a file is missing (the message names both expected files).
        ValueError: the index is corrupt or doesn't match the ``.bin`` (e.g. a truncated copy).
    """

    def __init__(self, path: str, skip_warmup: bool = False):
        self._do_init(os.fspath(path), skip_warmup)

    def _do_init(self, path: str, skip_warmup: bool) -> None:
        self._path = path
        self._skip_warmup = skip_warmup
        idx_file, bin_file = index_file_path(path), data_file_path(path)
        missing = [f for f in (idx_file, bin_file) if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"Indexed dataset '{path}' not found: {' and '.join(missing)} "
                f"{'does' if len(missing) == 1 else 'do'} not exist (a dataset prefix needs "
                f"both {idx_file} and {bin_file}). Check the data_prefix in your config, or "
                f"create the files with {_PREPROCESS_CMD}."
            )
        self._index = _Index(idx_file, skip_warmup)
        bin_size = os.path.getsize(bin_file)
        expected = self._index.expected_data_bytes()
        if bin_size != expected:
            raise ValueError(
                f"{bin_file} ({bin_size} bytes) does not match {idx_file}, which indexes "
                f"{len(self._index)} sequences ending at byte {expected}: the .bin is "
                f"{'truncated' if bin_size < expected else 'longer than indexed'} or the two "
                f"files come from different runs. Copy both files of the prefix again, or "
                f"rebuild them with {_PREPROCESS_CMD}."
            )
        if len(self._index.doc_idx) and int(self._index.doc_idx[-1]) > len(self._index):
            raise ValueError(
                f"{idx_file}: doc_idx points past the last sequence ({int(self._index.doc_idx[-1])}"
                f" > {len(self._index)}); the index is corrupt. {_PREPROCESS_HINT}"
            )
        if not skip_warmup:
            _warmup_mmap_file(bin_file)
        if bin_size:
            self._bin_mmap = np.memmap(bin_file, mode="r", order="C")
            self._bin_buffer = memoryview(self._bin_mmap)
        else:  # numpy cannot map an empty file
            self._bin_mmap = None
            self._bin_buffer = b""

    # numpy memmaps would pickle as full in-memory copies; re-open by path instead (this is
    # what DataLoader workers receive).
    def __getstate__(self):
        return {"path": self._path, "skip_warmup": True}

    def __setstate__(self, state):
        self._do_init(state["path"], state["skip_warmup"])

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, idx):
        """Sequence ``idx`` as a numpy array; a contiguous slice gives a list of arrays."""
        if isinstance(idx, (int, np.integer)):
            return self.get(int(idx))
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("Slices into an indexed dataset must be contiguous (step 1).")
            if stop <= start:
                return []
            sizes = self._index.sizes[start:stop]
            flat = np.frombuffer(
                self._bin_buffer,
                dtype=self.dtype,
                count=int(sizes.sum()),
                offset=int(self._index.pointers[start]),
            )
            return np.split(flat, np.cumsum(sizes)[:-1])
        raise TypeError(f"indices must be integers or slices, not {type(idx).__name__}")

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``idx`` (to its end by default)."""
        if not -len(self) <= idx < len(self):
            raise IndexError(f"sequence {idx} out of range for {len(self)} sequences")
        size = int(self._index.sizes[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"offset {offset} + length {length} out of range for sequence {idx} of size {size}"
            )
        ptr = int(self._index.pointers[idx]) + offset * self._index.dtype_size
        return np.frombuffer(self._bin_buffer, dtype=self.dtype, count=length, offset=ptr)

    @property
    def sizes(self) -> np.ndarray:
        """Tokens per sequence (``int32[N]``)."""
        return self._index.sizes

    def size(self, index: int) -> int:
        return int(self._index.sizes[index])

    @property
    def pointers(self) -> np.ndarray:
        """Byte offset of each sequence in the ``.bin`` (``int64[N]``)."""
        return self._index.pointers

    @property
    def doc_idx(self) -> np.ndarray:
        """Index of the first sequence of each document, followed by N (``int64[D]``)."""
        return self._index.doc_idx

    def get_doc_idx(self) -> np.ndarray:
        return self._index.doc_idx

    def set_doc_idx(self, doc_idx: np.ndarray) -> None:
        self._index.doc_idx = doc_idx

    @property
    def dtype(self):
        return self._index.dtype

    @property
    def path(self) -> str:
        return self._path

    @property
    def supports_prefetch(self) -> bool:
        return False

    @staticmethod
    def exists(path: str) -> bool:
        """Whether both ``path.idx`` and ``path.bin`` exist."""
        return os.path.isfile(index_file_path(path)) and os.path.isfile(data_file_path(path))


class MMapIndexedDatasetBuilder:
    """Write an indexed dataset: ``add_item`` per sequence, ``end_document``, then ``finalize``.

    Args:
        out_file: the ``.bin`` path to write.
        dtype: token dtype; :func:`best_fitting_dtype` picks it from the vocabulary size.

    Example::

        builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
        for doc in docs:
            builder.add_item(np.array(doc))
            builder.end_document()
        builder.finalize(index_file_path(prefix))
    """

    def __init__(self, out_file: str, dtype=np.int64):
        dtype_code(dtype)  # fail early on an unsupported dtype
        self._dtype = np.dtype(dtype).type
        self._out_file = os.fspath(out_file)
        self._data_file = open(self._out_file, "wb")  # closed by finalize() / close()
        self._sizes: list[int] = []
        self._doc_idx: list[int] = [0]

    def add_item(self, tensor) -> None:
        """Append one sequence (a list, numpy array or CPU tensor of token ids)."""
        array = np.asarray(tensor)
        if array.size and (
            np.issubdtype(array.dtype, np.integer) and np.issubdtype(self._dtype, np.integer)
        ):
            info = np.iinfo(self._dtype)
            if array.min() < info.min or array.max() > info.max:
                raise ValueError(
                    f"token ids in [{array.min()}, {array.max()}] do not fit the dataset dtype "
                    f"{np.dtype(self._dtype).name}; use a wider dtype (best_fitting_dtype)."
                )
        array = np.ascontiguousarray(array, dtype=self._dtype).reshape(-1)
        self._data_file.write(array.tobytes(order="C"))
        self._sizes.append(int(array.size))

    def end_document(self) -> None:
        """Mark the sequences added since the last call as one document."""
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, another_file: str) -> None:
        """Append the whole dataset at prefix ``another_file`` (same dtype) to this one."""
        other = MMapIndexedDataset(another_file, skip_warmup=True)
        if np.dtype(other.dtype) != np.dtype(self._dtype):
            raise ValueError(
                f"cannot merge {another_file} (dtype {np.dtype(other.dtype).name}) into "
                f"{self._out_file} (dtype {np.dtype(self._dtype).name})."
            )
        offset = len(self._sizes)
        self._sizes.extend(int(s) for s in other.sizes)
        self._doc_idx.extend(int(d) + offset for d in other.doc_idx[1:])
        with open(data_file_path(another_file), "rb") as f:
            shutil.copyfileobj(f, self._data_file, length=16 * 1024 * 1024)

    def close(self) -> None:
        """Close the ``.bin`` without writing an index (idempotent; ``finalize`` calls it)."""
        self._data_file.close()

    def finalize(self, index_file: str) -> None:
        """Close the ``.bin`` and write the ``.idx``."""
        self.close()
        sizes = np.asarray(self._sizes, dtype=np.int64)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1] * np.dtype(self._dtype).itemsize, out=pointers[1:])
        with open(index_file, "wb") as f:
            f.write(_HDR_MAGIC)
            f.write(struct.pack("<Q", _VERSION))
            f.write(struct.pack("<B", dtype_code(self._dtype)))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(self._doc_idx)))
            f.write(sizes.astype(np.int32).tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(np.asarray(self._doc_idx, dtype=np.int64).tobytes(order="C"))


#: the formats ``data_impl`` / ``--dataset-impl`` name (LiBai's and Megatron's)
DATASET_IMPLS = ("mmap", "lazy", "cached")


def make_builder(out_file: str, impl: str = "mmap", vocab_size: int | None = None):
    """Megatron's factory: an mmap builder with the best dtype for ``vocab_size``, or for
    ``lazy`` / ``cached`` the older ``TNTIDX`` format (int32 values, as LiBai writes it)."""
    if impl not in DATASET_IMPLS:
        raise ValueError(f"data_impl={impl!r} is not supported; use one of {DATASET_IMPLS}.")
    if impl != "mmap":
        return IndexedDatasetBuilder(out_file)
    return MMapIndexedDatasetBuilder(out_file, dtype=best_fitting_dtype(vocab_size))


def infer_dataset_impl(path: str) -> str:
    """``mmap`` or ``cached`` from the magic of ``path``'s ``.idx`` (LiBai's rule)."""

    with open(index_file_path(path), "rb") as f:
        magic = f.read(len(_HDR_MAGIC))
    if magic.startswith(LEGACY_MAGIC):
        return "cached"
    return "mmap"


def make_dataset(path: str, impl: str = "mmap", skip_warmup: bool = False):
    """Megatron's factory: open the indexed dataset at prefix ``path`` -- ``mmap``, the older
    ``lazy`` / ``cached`` format, or ``infer`` (from the file's magic)."""
    if impl not in (*DATASET_IMPLS, "infer"):
        raise ValueError(
            f"data_impl={impl!r} is not supported; use one of {(*DATASET_IMPLS, 'infer')}."
        )
    if impl == "infer" and os.path.exists(index_file_path(path)):
        impl = infer_dataset_impl(path)
    if impl in ("lazy", "cached"):
        return IndexedDataset(path, cached=impl == "cached")
    return MMapIndexedDataset(path, skip_warmup=skip_warmup)


def get_indexed_dataset(data_prefix: str, data_impl: str = "mmap", skip_warmup: bool = False):
    """LiBai's helper: open the indexed dataset at ``data_prefix`` and log its size."""
    dataset = make_dataset(os.fspath(data_prefix), data_impl, skip_warmup)
    logger.info(
        "indexed dataset %s: %d documents, %d sequences, %d tokens",
        data_prefix,
        max(len(dataset.doc_idx) - 1, 0),
        len(dataset),
        int(dataset.sizes.sum(dtype=np.int64)),
    )
    return dataset
