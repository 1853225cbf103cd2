"""LiBai's sample containers (``Instance`` of ``DistTensorData``) through our loaders."""

from __future__ import annotations

import pytest
import torch

from libai import dist
from libai.data.build import build_nlp_test_loader
from libai.data.structures import DistTensorData, Instance


class LiBaiStyleDataset(torch.utils.data.Dataset):
    """What a LiBai project's dataset returns: one Instance of DistTensorData per sample."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        ids = torch.arange(4) + 10 * i
        return Instance(
            input_ids=DistTensorData(ids),
            labels=DistTensorData(torch.tensor(i), placement_idx=-1),
        )


def test_instances_collate_into_the_batch_dict_models_take():
    dist.setup_dist_util({})
    loader = build_nlp_test_loader(LiBaiStyleDataset(), test_batch_size=4)
    batches = list(loader)
    assert [sorted(b) for b in batches] == [["input_ids", "labels"]] * 2
    want = torch.stack([torch.arange(4) + 10 * i for i in range(4)])
    assert torch.equal(batches[0]["input_ids"], want)
    assert batches[0]["labels"].tolist() == [0, 1, 2, 3]
    assert batches[1]["labels"].tolist() == [4, 5]  # the last, smaller batch


def test_instance_and_dist_tensor_data_behave_as_libai_s():
    sample = Instance(tokens=DistTensorData(torch.ones(3)), ids=[1, 2])
    assert sample.has("tokens") and len(sample) == 2 and sample.get("ids") == [1, 2]
    sample.mask = DistTensorData(torch.zeros(3), sbp_list=["broadcast"])
    batch = Instance.stack([sample, sample])
    assert batch.tokens.tensor.shape == (2, 3) and batch.ids == [[1, 2], [1, 2]]
    assert batch.mask.sbp_list == ["broadcast"]
    with pytest.raises(AttributeError, match="Cannot find field 'nothing'"):
        sample.nothing  # noqa: B018
    with pytest.raises(ValueError, match="different shapes"):
        DistTensorData.stack([DistTensorData(torch.ones(3)), DistTensorData(torch.ones(4))])
    with pytest.raises(NotImplementedError):
        iter(sample)
