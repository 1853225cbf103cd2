"""SimpleNetModule: how a batch becomes a loss, in the task-module standard."""

from __future__ import annotations

import logging

import torch
from torch import nn

from libai.fleetx import BasicModule, InputSpec

from .network import SimpleNet

logger = logging.getLogger("libai.projects.simple_net")


class SimpleNetModule(BasicModule):
    def get_model(self):
        model_cfg = self.cfg.Model
        return SimpleNet(
            image_size=model_cfg.image_size,
            hidden_size=model_cfg.hidden_size,
            num_blocks=model_cfg.num_blocks,
            class_num=model_cfg.class_num,
            dropout=model_cfg.dropout,
        )

    def get_loss_fn(self):
        return nn.CrossEntropyLoss()

    def training_step(self, batch):
        image, label = batch
        return self.loss_fn(self(image), label)

    def validation_step(self, batch):
        image, label = batch
        logits = self(image)
        correct = (logits.argmax(dim=-1) == label).sum()
        return {"loss": self.loss_fn(logits, label), "correct": correct, "count": label.numel()}

    def validation_epoch_end(self, log_dict):
        sums = log_dict["sums"]
        return {"acc": sums["correct"] / max(sums["count"], 1)}

    def training_step_end(self, log_dict):
        logger.info(
            "[train] epoch: %d, batch: %d, loss: %.6f, avg_batch_cost: %.5f sec, lr: %.3e",
            log_dict["epoch"],
            log_dict["batch"],
            log_dict["loss"],
            log_dict["train_cost"],
            log_dict["lr"],
        )

    def input_spec(self):
        return [InputSpec([None, self.cfg.Model.image_size], "float32", "image")]

    def predict_step(self, batch):
        image = batch[0] if isinstance(batch, (list, tuple)) else batch
        return torch.softmax(self(image), dim=-1)
