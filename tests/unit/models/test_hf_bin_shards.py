"""Sharded ``pytorch_model.bin`` checkpoints (``pytorch_model.bin.index.json``): the layout
older Hugging Face checkpoints ship in, written here by hand in the index format the
transformers documentation gives, and read against the state dict it was cut from."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from libai import dist
from libai.models.utils import CheckpointError, CheckpointReader, load_huggingface


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})


def _tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=67, n_positions=16, bos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _write_bin_shards(hf, path, n_shards=3):
    """``pytorch_model-0000k-of-0000n.bin`` files holding the state dict round-robin, and the
    index naming the file of each tensor."""
    path.mkdir()
    hf.config.save_pretrained(path)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    names = [f"pytorch_model-{k + 1:05d}-of-{n_shards:05d}.bin" for k in range(n_shards)]
    weight_map = {key: names[i % n_shards] for i, key in enumerate(state)}
    for name in names:
        torch.save({k: v for k, v in state.items() if weight_map[k] == name}, path / name)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return state, weight_map


def test_reader_reads_every_tensor_and_range_of_a_sharded_bin(tmp_path):
    """Every tensor read from the shards equals the state dict's, row ranges equal
    ``narrow`` of it, and the reader's map names the shard each tensor was saved in."""
    hf = _tiny_gpt2()
    state, weight_map = _write_bin_shards(hf, tmp_path / "bin")
    reader = CheckpointReader(str(tmp_path / "bin"))
    assert dict(reader.weight_map) == weight_map
    for key, want in state.items():
        assert torch.equal(reader.read(key), want), key
        assert reader.shape(key) == tuple(want.shape), key
        if want.dim() == 2:
            assert torch.equal(reader.read(key, 1, 3, 9), want[:, 3:9]), key


def test_model_from_sharded_bin_matches_transformers(tmp_path):
    """A libai model loaded from the sharded ``.bin`` gives transformers' logits."""
    hf = _tiny_gpt2()
    _write_bin_shards(hf, tmp_path / "bin")
    ids = torch.randint(0, 67, (2, 6))
    got = load_huggingface(tmp_path / "bin").eval()(ids)["logits"]
    torch.testing.assert_close(got, hf(ids).logits, atol=1e-5, rtol=0)


def test_sharded_bin_index_naming_a_missing_shard_is_an_error(tmp_path):
    """An index whose shard file is gone: a CheckpointError naming that file."""
    hf = _tiny_gpt2()
    _write_bin_shards(hf, tmp_path / "bin")
    (tmp_path / "bin" / "pytorch_model-00002-of-00003.bin").unlink()
    with pytest.raises(CheckpointError, match="pytorch_model-00002-of-00003.bin"):
        CheckpointReader(str(tmp_path / "bin"))
