"""FleetX's ``GPTDataset``: one split (Train / Eval / Test) of an indexed GPT corpus."""

from __future__ import annotations

from collections.abc import Sequence

from libai.config import LazyCall

SPLIT_INDEX = {"Train": 0, "Eval": 1, "Test": 2}


def GPTDataset(  # noqa: N802 - FleetX's name for what a YAML config builds
    data_prefix: str | None = None,
    split: Sequence[float] = (949.0, 50.0, 1.0),
    max_seq_length: int = 1024,
    mode: str = "Train",
    num_samples: int | None = None,
    seed: int = 1234,
    data_impl: str = "mmap",
    name: str = "gpt-2",
    input_dir: str | None = None,
    max_seq_len: int | None = None,
    model_type: str = "GPT",
):
    """The ``mode`` split of the corpus at ``data_prefix`` (``.bin`` / ``.idx``), cut into
    ``max_seq_length`` token samples: exactly the dataset that LiBai's
    ``build_nlp_train_val_test_loader`` builds for that split with the same ``split``,
    ``seed`` and sample count, so both front doors train on the same samples.

    ``data_prefix=None`` (explicitly) uses the built-in sample corpus, built offline on first
    use in our cache directory (see :mod:`libai.data.sample_corpus`); a given ``data_prefix``
    is only read, whatever its name. ``num_samples=None`` is one epoch of the split.

    FleetX's keys: ``input_dir`` (a directory of FleetX's ``_ids.npy`` / ``_idx.npz``
    corpus, read by :class:`~libai.data.datasets.fleetx_gpt.FleetXGPTDataset`: FleetX's
    samples for the same ``split``, ``seed`` and ``max_seq_len``), ``max_seq_len`` (=
    ``max_seq_length``) and ``model_type`` (FleetX's tokenizer family, unused).
    """
    if max_seq_len is not None:
        max_seq_length = max_seq_len
    if input_dir is not None:
        from libai.data.datasets.fleetx_gpt import FleetXGPTDataset

        if data_prefix is not None:
            raise ValueError(
                "GPTDataset: give input_dir (FleetX's _ids.npy / _idx.npz directory) or "
                f"data_prefix (a .bin / .idx prefix), not both; got {input_dir!r} and "
                f"{data_prefix!r}"
            )
        return FleetXGPTDataset(
            input_dir, split, max_seq_length, num_samples, mode, seed, model_type
        )
    from libai.data.build import build_train_valid_test_datasets
    from libai.data.data_utils import get_indexed_dataset
    from libai.data.datasets.gpt_dataset import GPT2Dataset
    from libai.data.sample_corpus import ensure_sample_dataset

    if mode not in SPLIT_INDEX:
        raise ValueError(f"GPTDataset mode must be one of {sorted(SPLIT_INDEX)}, got {mode!r}")
    if data_prefix is None:
        data_prefix = ensure_sample_dataset()["data_prefix"]  # the cache directory only
    config = LazyCall(GPT2Dataset)(
        name=name,
        data_prefix=data_prefix,
        indexed_dataset=LazyCall(get_indexed_dataset)(
            data_prefix=data_prefix, data_impl=data_impl, skip_warmup=False
        ),
        max_seq_length=max_seq_length,
        seed=seed,
    )
    samples = [0, 0, 0]  # only this split is built
    samples[SPLIT_INDEX[mode]] = num_samples
    dataset = build_train_valid_test_datasets(config, [list(split)], [1.0], samples)[
        SPLIT_INDEX[mode]
    ]
    if dataset is None:
        raise ValueError(
            f"GPTDataset: the {mode} split {list(split)} of {data_prefix} has no documents; "
            "give it a larger share or use more data"
        )
    return dataset
