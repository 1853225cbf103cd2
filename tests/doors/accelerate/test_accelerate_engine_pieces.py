"""Pieces of ``AccelerateEngine`` a user's own loop calls (Rapidformer's ``engine.gather``,
the evaluation batches, the composed optimizer), each against what it stands for: the
concatenation of every rank's tensor, the loader's own batches, the inner optimizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from launch import torchrun
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from libai import dist
from libai.accelerate.engine import AccelerateEngine
from libai.accelerate.hf_load import load_hf_weights
from libai.accelerate.templates import Finetuner, PreTrainer


def test_gather_concatenates_every_data_parallel_ranks_tensor_in_rank_order():
    results = torchrun("accelerate_gather.py", 2)
    for r in results:
        assert r["ok"], f"{r['error']}\n{r['trace']}"
    want = torch.cat([(torch.arange(6).reshape(3, 2) + 10 * k).t() for k in (0, 1)]).tolist()
    assert sorted(r["dp_rank"] for r in results) == [0, 1]
    for r in results:
        assert r["dp"] == 2 and r["gathered"] == want


def test_gather_on_one_rank_is_the_tensor(tmp_path):
    engine = AccelerateEngine({"save": str(tmp_path)})
    t = torch.arange(4.0)
    assert engine.gather(t) is t


def test_eval_batches_yield_the_loaders_batches_up_to_max_batches(tmp_path):
    engine = AccelerateEngine({"save": str(tmp_path)})
    loader = DataLoader(TensorDataset(torch.arange(10).reshape(5, 2)), batch_size=1)
    want = [b[0].tolist() for b in loader]
    for max_batches, n in ((0, 5), (2, 2), (5, 5), (7, 5)):
        got = [b[0].tolist() for b in engine.eval_batches(loader, max_batches=max_batches)]
        assert got == want[:n], max_batches
    assert len(list(engine.eval_batches(loader))) == 5  # the default: all


def test_the_composed_optimizer_shows_the_inner_optimizers_attributes(tmp_path):
    engine = AccelerateEngine({"save": str(tmp_path), "train_iters": 4})
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    _, optimizer, _ = engine.compose(model, optimizer=inner)
    assert optimizer.param_groups is inner.param_groups and optimizer.defaults is inner.defaults
    assert optimizer.state is inner.state
    assert optimizer.state_dict() == inner.state_dict()


@pytest.mark.parametrize("template", [Finetuner, PreTrainer])
def test_a_replaced_forward_step_is_refused_under_pipeline_stages_only(tmp_path, template):
    """A template's own ``run_forward_step`` sees whole models: it runs on pp 1 and is an
    error on any pipeline split (pp 2 included); the default step needs no loss function."""

    class Custom(template):
        def run_forward_step(self, batch, model):
            assert model == "the runner's model"
            return {"loss": torch.tensor(2.5)}

    engine = AccelerateEngine({"save": str(tmp_path)})
    engine.runner = SimpleNamespace(model="the runner's model")
    assert template(engine)._loss_fn() is None
    assert Custom(engine)._loss_fn()({"x": 1}).item() == 2.5
    for pp in (2, 4):
        engine.util = SimpleNamespace(
            layout=dist.resolve_layout(
                {"pipeline_parallel_size": pp, "pipeline_num_layers": 4}, world_size=pp
            )
        )
        with pytest.raises(ValueError, match="run_forward_step cannot run split over pipeline"):
            Custom(engine)._loss_fn()


@pytest.mark.parametrize("safetensors", [True, False], ids=["safetensors", "bin"])
def test_load_of_a_sharded_hugging_face_directory_copies_every_shard(tmp_path, safetensors):
    """``--load DIR`` of a model transformers saved in shards (an index file naming them):
    every tensor of every shard lands in the model, as transformers saved it."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    saved = transformers.BertForMaskedLM(config)
    if safetensors:
        saved.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:  # transformers 5 writes safetensors only: torch's shards as its earlier releases did
        saved.config.save_pretrained(tmp_path)
        names = list(saved.state_dict())
        weight_map = {}
        for i in range(3):
            shard = f"pytorch_model-{i + 1:05d}-of-00003.bin"
            part = {n: saved.state_dict()[n].clone() for n in names[i::3]}
            torch.save(part, tmp_path / shard)
            weight_map.update(dict.fromkeys(part, shard))
        index = {"metadata": {}, "weight_map": weight_map}
        (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert len(list(tmp_path.glob("*-of-*"))) > 2
    torch.manual_seed(1)
    model = transformers.BertForMaskedLM(config)
    load_hf_weights(model, str(tmp_path))
    want = saved.state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=0, msg=name)
