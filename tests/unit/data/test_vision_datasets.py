"""LiBai's ImageNetDataset (root/train, root/val folders) and CIFAR100Dataset (local
python-pickle files in the real CIFAR-100 format) on tiny files written here: pixels and
labels against the files, LiBai's Instance samples, the loaders' batches, clear errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from train_net_helpers import ROOT
from vision_files import cifar100_entry

from libai.config import LazyConfig, instantiate
from libai.data import build_image_test_loader
from libai.data.build import trivial_batch_collator
from libai.data.datasets import CIFAR100Dataset, ImageNetDataset
from libai.data.structures import DistTensorData, Instance
from libai.data.transforms import Compose, ToTensor


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    """{split: {path: pixels}} under root/<split>/<class>/, 2 classes (sorted: ant, bee)."""
    root = tmp_path_factory.mktemp("imnet")
    rng = np.random.default_rng(0)
    files = {}
    for split, n in (("train", 3), ("val", 1)):
        for cls in ("bee", "ant"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                px = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
                Image.fromarray(px).save(root / split / cls / f"{i}.png")
                files[(split, cls, i)] = px
    return root, files


def test_imagenet_dataset_reads_split_folders_as_instances(imagenet):
    root, files = imagenet
    train = ImageNetDataset(str(root), train=True, transform=Compose([ToTensor()]))
    assert train.classes == ["ant", "bee"] and len(train) == 6
    sample = train[4]  # sorted: ant/0..2, bee/0..2
    assert isinstance(sample, Instance) and isinstance(sample.images, DistTensorData)
    assert sample.images.placement_idx == 0 and sample.labels.placement_idx == -1
    want = torch.from_numpy(files[("train", "bee", 1)]).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(sample.images.tensor, want)
    assert sample.labels.tensor.dtype == torch.long and int(sample.labels.tensor) == 1
    val = ImageNetDataset(str(root), train=False, transform=Compose([ToTensor()]))
    assert len(val) == 2 and [label for _, label in val.samples] == [0, 1]
    batch = trivial_batch_collator([val[0], val[1]])
    assert batch["images"].shape == (2, 3, 6, 5) and batch["labels"].tolist() == [0, 1]
    with pytest.raises(FileNotFoundError, match=r"train/ and val/"):
        ImageNetDataset(str(root / "train"), train=True)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    out = {}
    for name, n, seed, as_bytes in (("train", 6, 1, True), ("test", 4, 2, False)):
        entry, data, labels = cifar100_entry(n, seed, as_bytes)
        (root / "cifar-100-python").mkdir(parents=True, exist_ok=True)
        with open(root / "cifar-100-python" / name, "wb") as f:
            pickle.dump(entry, f)
        out[name] = (data, labels)
    return root, out


def test_cifar100_dataset_reads_the_pickles(cifar):
    root, files = cifar
    for name, train in (("train", True), ("test", False)):
        data, labels = files[name]
        ds = CIFAR100Dataset(str(root), train=train, transform=Compose([ToTensor()]))
        assert len(ds) == len(labels)
        for i in (0, len(ds) - 1):
            sample = ds[i]
            want = torch.from_numpy(data[i].reshape(3, 32, 32)).float() / 255
            torch.testing.assert_close(sample.images.tensor, want)
            assert int(sample.labels.tensor) == labels[i]
    loader = build_image_test_loader(
        CIFAR100Dataset(str(root), train=False, transform=Compose([ToTensor()])), 2
    )
    batches = list(loader)
    assert [b["labels"].tolist() for b in batches] == [files["test"][1][:2], files["test"][1][2:]]


def test_cifar100_missing_files_and_unsafe_pickles_are_clear_errors(tmp_path, cifar):
    with pytest.raises(FileNotFoundError, match="download=True cannot fetch it here"):
        CIFAR100Dataset(str(tmp_path), train=True, download=True)
    with pytest.raises(FileNotFoundError, match=r"cifar-100-python/test not found"):
        CIFAR100Dataset(str(tmp_path), train=False)

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    with open(folder / "train", "wb") as f:
        pickle.dump({"data": Boom(), "fine_labels": []}, f)
    with pytest.raises(pickle.UnpicklingError, match=r"builtins.print is not allowed"):
        CIFAR100Dataset(str(tmp_path), train=True)


def test_libai_cifar100_data_config_builds_mixed_batches(cifar):
    """LiBai's configs/common/data/cifar100.py (unmodified; swin_cifar100.py and
    swinv2_cifar100.py build on it) with the root and image size overridden: the train
    loader yields Mixup / CutMix batches of soft targets over 100 classes, the test loader
    the files' labels."""
    root, files = cifar
    cfg = LazyConfig.load(str(ROOT / "tests/fixtures/libai/configs/common/data/cifar100.py"))
    cfg = LazyConfig.apply_overrides(
        cfg,
        [
            f"dataloader.train.dataset.0.root={root}",
            f"dataloader.test.0.dataset.root={root}",
            "dataloader.train.dataset.0.transform.transforms.0.size=[16,16]",
            "dataloader.test.0.dataset.transform.transforms.0.size=16",
            "dataloader.test.0.dataset.transform.transforms.1.size=16",
            "dataloader.train.num_workers=0",
            "dataloader.test.0.num_workers=0",
        ],
    )
    train_loader, _, _ = instantiate(cfg.dataloader.train, train_batch_size=2, seed=0)
    batch = next(iter(train_loader))
    assert batch["images"].shape == (2, 3, 16, 16)
    targets = batch["labels"]
    assert targets.shape == (2, 100)
    torch.testing.assert_close(targets.sum(1), torch.ones(2))
    # label smoothing 0.1 puts 0.001 on every class; the rest sits on the two mixed labels
    assert bool((targets >= 0.001 - 1e-7).all())
    above = targets > 0.001 + 1e-6
    assert set(above.nonzero()[:, 1].tolist()) <= set(files["train"][1])
    assert above.sum(1).tolist() in ([1, 1], [2, 2])  # one class when both labels are equal
    torch.testing.assert_close((targets - 0.001).clamp(min=0).sum(1), torch.full((2,), 0.9))
    test_loader = instantiate(cfg.dataloader.test[0], test_batch_size=4)
    assert next(iter(test_loader))["labels"].tolist() == files["test"][1]


def test_mixup_runs_in_the_main_process_with_loader_workers(imagenet):
    """With DataLoader workers, Mixup still draws from the main process's numpy generator
    (LiBai applies it in the trainer): batch k mixes at the k-th draw -- not every worker
    repeating one copy of the generator."""
    from libai.data import build_image_train_loader
    from libai.data.mixup import Mixup

    root, _ = imagenet
    ds = ImageNetDataset(str(root), train=True, transform=Compose([ToTensor()]))
    plain, _, _ = build_image_train_loader([ds], 2, num_workers=2, seed=5)
    mix = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0, num_classes=2)
    mixed, _, _ = build_image_train_loader([ds], 2, num_workers=2, seed=5, mixup_func=mix)
    np.random.seed(11)
    lams = []
    for _ in range(2):
        np.random.rand()
        lams.append(np.random.beta(0.8, 0.8))
    np.random.seed(11)
    for lam, want, got in zip(lams, plain, mixed):
        x = want["images"]
        torch.testing.assert_close(got["images"], lam * x + (1 - lam) * x.flip(0))
        onehot = torch.nn.functional.one_hot(want["labels"], 2).float()
        torch.testing.assert_close(got["labels"], lam * onehot + (1 - lam) * onehot.flip(0))
    assert lams[0] != lams[1]


def test_augmentation_is_keyed_by_epoch_in_any_worker_and_after_resume(imagenet):
    """A random augmentation of sample i in epoch e is default_rng([seed, i, e]): the same
    with 0 or 2 DataLoader workers (a worker's own read count would repeat epoch 0's crops
    whenever a sample lands on a worker that has not read it) and when the loader starts
    mid-run at a resume point."""
    from libai.data import build_image_train_loader
    from libai.data.samplers import CyclicSampler, EpochIndex
    from libai.data.transforms import RandomResizedCrop

    root, _ = imagenet
    ds = ImageNetDataset(
        str(root), train=True, transform=Compose([RandomResizedCrop(4), ToTensor()])
    )
    sampler = CyclicSampler(ds, 2, shuffle=True, seed=1)
    order = [b for b, _ in zip(iter(sampler), range(9))]  # 3 batches per epoch: 3 epochs
    assert [[i.epoch for i in b] for b in order][::3] == [[0, 0], [1, 1], [2, 2]]

    def want(index: EpochIndex) -> torch.Tensor:
        rng = np.random.default_rng([0, int(index), index.epoch])
        return ds.transform(ds.load_image(int(index)), rng)

    for workers in (0, 2):
        loader, _, _ = build_image_train_loader([ds], 2, num_workers=workers, seed=1)
        for batch_ids, got in zip(order, loader):
            torch.testing.assert_close(got["images"], torch.stack([want(i) for i in batch_ids]))
    resumed, _, _ = build_image_train_loader([ds], 2, consumed_samples=8, seed=1)
    got = next(iter(resumed))["images"]
    torch.testing.assert_close(got, torch.stack([want(i) for i in order[4]]))
