"""RoBERTa (``model_type: roberta``): ``RobertaForMaskedLM`` / ``RobertaModel`` /
``RobertaForCausalLM`` / ``RobertaForSequenceClassification`` <-> libai RoBERTa. The backbone
maps exactly as BERT's (:mod:`~libai.models.utils.model_loader.bert_loader`); only the heads
and defaults differ. A classifier loaded from a checkpoint without one (e.g. a masked-LM
checkpoint) starts fresh, with a warning (BERT's ``optional_missing``)."""

from __future__ import annotations

from libai.models.roberta_model import (
    RobertaForCausalLM,
    RobertaForClassification,
    RobertaForPreTraining,
    RobertaModel,
)
from libai.models.utils.model_loader.bert_loader import (
    BertLoaderHuggerFace,
    encoder_rules,
    lm_head_rules,
)
from libai.models.utils.weight_mapping import Copy


class RobertaLoaderHuggerFace(BertLoaderHuggerFace):
    """Loads / exports RoBERTa; ``RobertaForCausalLM`` is exported with ``is_decoder=True``,
    ``RobertaForClassification`` with its ``num_labels`` (``id2label``)."""

    model_types = ("roberta",)
    base_model_prefix = "roberta"
    architectures = {
        "RobertaForMaskedLM": RobertaForPreTraining,
        "RobertaModel": RobertaModel,
        "RobertaForCausalLM": RobertaForCausalLM,
        "RobertaForSequenceClassification": RobertaForClassification,
    }
    ignore_unexpected = (
        r"embeddings\.position_ids$",
        r"embeddings\.token_type_ids$",
        r"lm_head\.decoder\.(weight|bias)$",
        r"^(roberta\.)?pooler\.",  # heads are built without the pooler
    )
    hf_defaults = dict(
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=1,
        max_position_embeddings=512,
    )

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        out = super().hf_config(cfg, model)
        out.update(bos_token_id=0, eos_token_id=2)
        return out

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        if model_cls is RobertaModel:
            return encoder_rules(cfg, "", "", cfg.get("add_pooling_layer", True))
        table = encoder_rules(cfg, "roberta.", "roberta.", pooler=False)
        if model_cls is RobertaForClassification:
            return table + [
                Copy(f"classifier.{linear}.{kind}", f"classifier.{linear}.{kind}")
                for linear in ("dense", "out_proj")
                for kind in ("weight", "bias")
            ]
        table += lm_head_rules(
            "lm_head.", "lm_head.", "lm_head.bias", "roberta.embeddings.word_embeddings.weight"
        )
        for kind in ("weight", "bias"):
            table.append(Copy(f"lm_head.layernorm.{kind}", f"lm_head.layer_norm.{kind}"))
        return table
