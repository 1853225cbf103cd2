"""Every "loss" entry of a model's output is a logged term (LiBai logs BERT's ``lm_loss`` and
``sop_loss``): the runner keeps each term's mean over the micro-batches, reduced with the
loss in one reduction, and the trainer puts them in the event storage beside
``total_loss``, so the terminal, metrics.json and TensorBoard writers show them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from libai import dist
from libai.runtime.parallel import ModelRunner
from libai.runtime.trainer import EagerTrainer
from libai.utils.events import EventStorage


class TwoLosses(nn.Module):
    """A linear model whose output has two loss terms and a non-loss entry."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 2)

    def forward(self, x, y):
        out = self.proj(x)
        return {
            "mse_loss": (out[:, 0] - y).square().mean(),
            "l1_loss": (out[:, 1] - y).abs().mean(),
            "logits": out,
            "aux_loss": None,  # skipped, as total_loss skips it
        }


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(6, 4, generator=g), "y": torch.randn(6, generator=g)}


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})


@pytest.mark.parametrize("micro", [1, 3])
def test_each_term_is_its_mean_over_micro_batches_and_they_sum_to_the_loss(micro):
    model = TwoLosses()
    runner = ModelRunner(model, num_microbatches=micro)
    data = batch()
    loss = runner.forward_backward(data)
    want = {"mse_loss": 0.0, "l1_loss": 0.0}
    with torch.no_grad():
        for rows in torch.arange(6).chunk(micro):
            out = model(data["x"][rows], data["y"][rows])
            for key in want:
                want[key] += float(out[key]) / micro
    terms = runner.last_loss_terms
    assert sorted(terms) == ["l1_loss", "mse_loss"]
    for key, value in want.items():
        assert float(terms[key]) == pytest.approx(value, rel=1e-6)
    assert float(loss) == pytest.approx(sum(want.values()), rel=1e-6)


def test_a_loss_fn_returning_a_tensor_has_no_terms():
    model = TwoLosses()
    runner = ModelRunner(model, loss_fn=lambda b: model(**b)["mse_loss"])
    runner.forward_backward(batch())
    assert runner.last_loss_terms == {}


def test_the_trainer_records_every_term_beside_total_loss():
    model = TwoLosses()
    runner = ModelRunner(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = EagerTrainer(runner, [batch(s) for s in range(3)], optimizer)
    trainer.max_iter = 3
    with EventStorage(0) as trainer.storage:
        for trainer.iter in range(2):
            trainer.storage.iter = trainer.iter
            trainer.run_step()
        latest = trainer.storage.latest()
        assert {"total_loss", "mse_loss", "l1_loss"} <= set(latest)
        total = latest["total_loss"][0]
        assert total == pytest.approx(latest["mse_loss"][0] + latest["l1_loss"][0], rel=1e-6)


def test_a_loss_fn_returning_a_mapping_has_its_terms_and_their_sum():
    model = TwoLosses()
    runner = ModelRunner(model, loss_fn=lambda b: model(**b))
    data = batch()
    loss = runner.forward_backward(data)
    with torch.no_grad():
        out = model(**data)
    terms = runner.last_loss_terms
    assert sorted(terms) == ["l1_loss", "mse_loss"]
    assert float(terms["mse_loss"]) == pytest.approx(float(out["mse_loss"]), rel=1e-6)
    assert float(loss) == pytest.approx(float(out["mse_loss"] + out["l1_loss"]), rel=1e-6)


class BareLoss(TwoLosses):
    def forward(self, x, y):
        return super().forward(x, y)["mse_loss"]


def test_a_model_returning_a_bare_tensor_is_told_the_contract():
    runner = ModelRunner(BareLoss())
    with pytest.raises(TypeError, match=r"returned a Tensor, not a dict.*loss_fn"):
        runner.forward_backward(batch())
