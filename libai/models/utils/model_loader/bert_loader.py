"""BERT (``model_type: bert``): ``BertForPreTraining`` / ``BertModel`` /
``BertForSequenceClassification`` <-> libai BERT.

transformers' separate ``query`` / ``key`` / ``value`` become libai's fused
``query_key_value``; its post-LN block maps as ``attention.output.LayerNorm`` ->
``input_layernorm`` and ``output.LayerNorm`` -> ``post_cross_attention_layernorm``.
"""

from __future__ import annotations

from libai.models.bert_model import BertForClassification, BertForPreTraining, BertModel
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import QKV, Copy, expand

#: transformers' ``hidden_act`` -> libai's activation
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
}
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def encoder_rules(cfg: dict, p: str, h: str, pooler: bool) -> list:
    """Embeddings, encoder layers and (with ``pooler``) the pooler; ``p`` / ``h``: libai / HF
    backbone prefixes."""
    if cfg.get("apply_residual_post_layernorm") is not None:
        raise NotImplementedError(
            "this model has LiBai's Megatron layout (model.cfg.apply_residual_post_layernorm "
            "is set: pre-LN blocks, final LayerNorm), which Hugging Face's BERT / RoBERTa "
            "checkpoints do not have; leave the key out for the Hugging Face layout."
        )
    layer, hl = p + "encoders.{i}.", h + "encoder.layer.{i}."
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qkv = dict(num_heads=heads, head_size=hidden // heads)
    att = hl + "attention."
    table = [
        Copy(p + "embeddings.vocab_embeddings.weight", h + "embeddings.word_embeddings.weight"),
        Copy(
            p + "embeddings.position_embeddings.weight", h + "embeddings.position_embeddings.weight"
        ),
        Copy(p + "embeddings.layernorm.weight", h + "embeddings.LayerNorm.weight"),
        Copy(p + "embeddings.layernorm.bias", h + "embeddings.LayerNorm.bias"),
    ]
    if cfg["num_tokentypes"] > 0:
        table.append(
            Copy(
                p + "embeddings.tokentype_embeddings.weight",
                h + "embeddings.token_type_embeddings.weight",
            )
        )
    for kind in ("weight", "bias"):
        table += [
            QKV(
                layer + f"self_attention.query_key_value.{kind}",
                *(att + f"self.{x}.{kind}" for x in ("query", "key", "value")),
                **qkv,
            ),
            Copy(layer + f"self_attention.dense.{kind}", att + f"output.dense.{kind}"),
            Copy(layer + f"input_layernorm.{kind}", att + f"output.LayerNorm.{kind}"),
            Copy(layer + f"mlp.dense_h_to_4h.{kind}", hl + f"intermediate.dense.{kind}"),
            Copy(layer + f"mlp.dense_4h_to_h.{kind}", hl + f"output.dense.{kind}"),
            Copy(layer + f"post_cross_attention_layernorm.{kind}", hl + f"output.LayerNorm.{kind}"),
        ]
        if pooler:
            table.append(Copy(p + f"pooler.dense.{kind}", h + f"pooler.dense.{kind}"))
    return expand(table, cfg["hidden_layers"])


def lm_head_rules(libai: str, hf: str, hf_bias: str, hf_word_embeddings: str) -> list:
    """The masked-LM head ``libai`` (a :class:`~libai.models.bert_model.BertLMHead`)."""
    return [
        Copy(libai + "dense.weight", hf + "dense.weight"),
        Copy(libai + "dense.bias", hf + "dense.bias"),
        Copy(libai + "lm_logits.bias", hf_bias),
        # the tied copy of the word embedding on the last pipeline stage
        Copy(libai + "lm_logits.weight", hf_word_embeddings),
    ]


class BertLoaderHuggerFace(ModelLoaderHuggerFace):
    """Loads / exports BERT. ``libai_config`` rejects what the libai model cannot represent
    (relative position embeddings, cross-attention, untied MLM decoder)."""

    model_types = ("bert",)
    base_model_prefix = "bert"
    architectures = {
        "BertForPreTraining": BertForPreTraining,
        "BertModel": BertModel,
        "BertForSequenceClassification": BertForClassification,
    }
    ignore_unexpected = (
        r"embeddings\.position_ids$",
        r"embeddings\.token_type_ids$",
        r"predictions\.decoder\.(weight|bias)$",
    )
    #: fine-tuning a classifier from a pretraining checkpoint: the head starts fresh
    optional_missing = (r"^classifier\.",)
    #: ``config.json`` defaults of this model type (transformers' config class)
    hf_defaults = dict(
        type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0, max_position_embeddings=512
    )

    def libai_config(self, hf: dict) -> dict:
        hf = {**self.hf_defaults, **hf}
        act = hf.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act={act!r} is not supported: {sorted(ACTIVATIONS)}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type={hf['position_embedding_type']!r} is not supported "
                "(only 'absolute')"
            )
        if hf.get("add_cross_attention"):
            raise ValueError("add_cross_attention=True (a BERT decoder) is not supported")
        if not hf.get("tie_word_embeddings", True):
            raise ValueError("tie_word_embeddings=False is not supported (the MLM head is tied)")
        cfg = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            hidden_dropout_prob=hf.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=hf.get("attention_probs_dropout_prob", 0.1),
            max_position_embeddings=hf["max_position_embeddings"],
            num_tokentypes=hf["type_vocab_size"],
            initializer_range=hf.get("initializer_range", 0.02),
            layernorm_eps=hf["layer_norm_eps"],
            activation=ACTIVATIONS[act],
            pad_token_id=hf["pad_token_id"],
            attn_mask_type="causal" if hf.get("is_decoder") else "padding",
        )
        labels = hf.get("id2label")
        model_cls = self.model or self._default_class(hf)
        if issubclass(model_cls, BertForClassification):  # BERT's and RoBERTa's classifiers
            cfg["num_labels"] = len(labels) if labels else hf.get("num_labels", 2)
            cfg["classifier_dropout"] = hf.get("classifier_dropout")
        return cfg

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        out = dict(
            model_type=cls.model_types[0],
            architectures=[cls.hf_architecture(model)],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            hidden_dropout_prob=cfg["hidden_dropout_prob"],
            attention_probs_dropout_prob=cfg["attention_probs_dropout_prob"],
            max_position_embeddings=cfg["max_position_embeddings"],
            type_vocab_size=cfg["num_tokentypes"],
            initializer_range=cfg["initializer_range"],
            layer_norm_eps=cfg["layernorm_eps"],
            hidden_act=_HF_ACTIVATIONS[cfg["activation"]],
            pad_token_id=cfg["pad_token_id"],
            is_decoder=cfg["attn_mask_type"] == "causal",
            position_embedding_type="absolute",
            tie_word_embeddings=True,
        )
        if "num_labels" in cfg:
            out["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg["num_labels"])}
            out["label2id"] = {f"LABEL_{i}": i for i in range(cfg["num_labels"])}
            out["classifier_dropout"] = cfg["classifier_dropout"]
        return out

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        if model_cls is BertModel:
            return encoder_rules(cfg, "", "", cfg.get("add_pooling_layer", True))
        hf_bert = cls.base_model_prefix + "."  # ERNIE's checkpoints: "ernie."
        table = encoder_rules(cfg, "bert.", hf_bert, pooler=True)
        if issubclass(model_cls, BertForClassification):  # BERT's and ERNIE's
            return table + [
                Copy("classifier.weight", "classifier.weight"),
                Copy("classifier.bias", "classifier.bias"),
            ]
        head, hf = "cls_head.predictions.", "cls.predictions."
        table += lm_head_rules(
            head, hf + "transform.", hf + "bias", hf_bert + "embeddings.word_embeddings.weight"
        )
        for kind in ("weight", "bias"):
            table += [
                Copy(head + f"layernorm.{kind}", hf + f"transform.LayerNorm.{kind}"),
                Copy(f"cls_head.seq_relationship.{kind}", f"cls.seq_relationship.{kind}"),
            ]
        return table
