"""ViT (``model_type: vit``): ``ViTForImageClassification`` <-> libai ``VisionTransformer``."""

from __future__ import annotations

from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import QKV, Copy, expand
from libai.models.vit import VisionTransformer

#: transformers' activation names -> libai's
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


class ViTLoaderHuggerFace(ModelLoaderHuggerFace):
    """Loads ``ViTForImageClassification`` checkpoints, and ``ViTModel`` ones (a pretrained
    backbone: the head keeps a fresh initialization, e.g. with ``num_classes=`` given)."""

    model_types = ("vit",)
    base_model_prefix = "vit"
    architectures = {"ViTForImageClassification": VisionTransformer}
    # ViTModel's pooler, and the mask token of masked-image-modeling checkpoints
    ignore_unexpected = (r"(^|\.)pooler\.dense\.", r"embeddings\.mask_token$")
    optional_missing = (r"^classifier\.",)

    def libai_config(self, hf: dict) -> dict:
        act = hf.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise ValueError(f"ViT hidden_act={act!r} is not supported: {sorted(ACTIVATIONS)}")
        image_size, patch_size = hf.get("image_size", 224), hf.get("patch_size", 16)
        for key, value in (("image_size", image_size), ("patch_size", patch_size)):
            if not isinstance(value, int):
                raise ValueError(f"ViT {key}={value!r}: only square images/patches are supported")
        hidden = hf["hidden_size"]
        num_labels = hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
        return dict(
            img_size=image_size,
            patch_size=patch_size,
            in_chans=hf.get("num_channels", 3),
            embed_dim=hidden,
            depth=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            mlp_ratio=hf.get("intermediate_size", 4 * hidden) / hidden,
            drop_rate=hf.get("hidden_dropout_prob", 0.0),
            attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
            num_classes=num_labels,
            layernorm_epsilon=hf.get("layer_norm_eps", 1e-12),
            qkv_bias=hf.get("qkv_bias", True),
            activation=ACTIVATIONS[act],
            initializer_range=hf.get("initializer_range", 0.02),
        )

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        hidden = cfg["embed_dim"]
        return dict(
            model_type="vit",
            architectures=[cls.hf_architecture(model)],
            image_size=cfg["img_size"],
            patch_size=cfg["patch_size"],
            num_channels=cfg["in_chans"],
            hidden_size=hidden,
            num_hidden_layers=cfg["depth"],
            num_attention_heads=cfg["num_heads"],
            intermediate_size=int(round(hidden * cfg["mlp_ratio"])),
            hidden_act={"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[cfg["activation"]],
            hidden_dropout_prob=cfg["drop_rate"],
            attention_probs_dropout_prob=cfg["attn_drop_rate"],
            layer_norm_eps=cfg["layernorm_epsilon"],
            qkv_bias=cfg["qkv_bias"],
            initializer_range=cfg["initializer_range"],
            id2label={str(i): f"LABEL_{i}" for i in range(cfg["num_classes"])},
            label2id={f"LABEL_{i}": i for i in range(cfg["num_classes"])},
            encoder_stride=cfg["patch_size"],
        )

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        h, layer = "vit.", "blocks.{i}."
        hl = h + "encoder.layer.{i}."
        heads = cfg["num_heads"]
        qkv = dict(num_heads=heads, head_size=cfg["embed_dim"] // heads)
        attn = hl + "attention.attention."
        table = [
            Copy("embeddings.cls_token", h + "embeddings.cls_token"),
            Copy("embeddings.pos_embed", h + "embeddings.position_embeddings"),
            Copy(
                "embeddings.patch_embed.weight", h + "embeddings.patch_embeddings.projection.weight"
            ),
            Copy("embeddings.patch_embed.bias", h + "embeddings.patch_embeddings.projection.bias"),
            Copy(layer + "input_layernorm.weight", hl + "layernorm_before.weight"),
            Copy(layer + "input_layernorm.bias", hl + "layernorm_before.bias"),
            QKV(
                layer + "self_attention.query_key_value.weight",
                attn + "query.weight",
                attn + "key.weight",
                attn + "value.weight",
                **qkv,
            ),
            Copy(layer + "self_attention.dense.weight", hl + "attention.output.dense.weight"),
            Copy(layer + "self_attention.dense.bias", hl + "attention.output.dense.bias"),
            Copy(layer + "post_cross_attention_layernorm.weight", hl + "layernorm_after.weight"),
            Copy(layer + "post_cross_attention_layernorm.bias", hl + "layernorm_after.bias"),
            Copy(layer + "mlp.dense_h_to_4h.weight", hl + "intermediate.dense.weight"),
            Copy(layer + "mlp.dense_h_to_4h.bias", hl + "intermediate.dense.bias"),
            Copy(layer + "mlp.dense_4h_to_h.weight", hl + "output.dense.weight"),
            Copy(layer + "mlp.dense_4h_to_h.bias", hl + "output.dense.bias"),
            Copy("norm.weight", h + "layernorm.weight"),
            Copy("norm.bias", h + "layernorm.bias"),
            Copy("head.weight", "classifier.weight"),
            Copy("head.bias", "classifier.bias"),
        ]
        if cfg["qkv_bias"]:
            table.append(
                QKV(
                    layer + "self_attention.query_key_value.bias",
                    attn + "query.bias",
                    attn + "key.bias",
                    attn + "value.bias",
                    **qkv,
                )
            )
        return expand(table, cfg["depth"])
