"""ERNIE (``model_type: ernie``): transformers' ``ErnieForPreTraining`` /
``ErnieForSequenceClassification`` <-> libai's :mod:`~libai.models.ernie_model`: BERT's
mapping under the ``ernie.`` prefix plus the task-type embedding."""

from __future__ import annotations

from libai.models.ernie_model import ErnieForClassification, ErnieForPreTraining
from libai.models.utils.model_loader.bert_loader import BertLoaderHuggerFace
from libai.models.utils.weight_mapping import Copy


class ErnieLoaderHuggerFace(BertLoaderHuggerFace):
    """Loads / exports ERNIE pretraining and classification checkpoints (``use_task_id`` and
    ``task_type_vocab_size`` carried over; the task id is 0, transformers' default)."""

    model_types = ("ernie",)
    base_model_prefix = "ernie"
    architectures = {
        "ErnieForPreTraining": ErnieForPreTraining,
        "ErnieForSequenceClassification": ErnieForClassification,
    }
    hf_defaults = {
        **BertLoaderHuggerFace.hf_defaults,
        "use_task_id": False,
        "task_type_vocab_size": 3,
    }

    def libai_config(self, hf: dict) -> dict:
        hf = {**self.hf_defaults, **hf}
        return {
            **super().libai_config(hf),
            "use_task_id": bool(hf["use_task_id"]),
            "task_type_vocab_size": hf["task_type_vocab_size"],
        }

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        return {
            **super().hf_config(cfg, model),
            "use_task_id": bool(cfg["use_task_id"]),
            "task_type_vocab_size": cfg["task_type_vocab_size"],
        }

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        table = super().rules(cfg, model_cls)
        if cfg.get("use_task_id"):
            table.append(
                Copy(
                    "bert.embeddings.task_type_embeddings.weight",
                    "ernie.embeddings.task_type_embeddings.weight",
                )
            )
        return table
