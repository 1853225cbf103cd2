"""Swin (``model_type: swin`` / ``swinv2``): ``SwinForImageClassification`` /
``Swinv2ForImageClassification`` <-> libai ``SwinTransformer`` / ``SwinTransformerV2``.

The checkpoint's separate query / key / value projections become one ``qkv`` projection
laid out ``[q; k; v]`` (LiBai's Swin layout, replicated over tp); v2's query and value
biases stay separate (``q_bias``, ``v_bias``; its key has none). transformers 5 renames
Swin v1's modules at run time (``q_proj``, ``fc1``, ...) but saves the classic names read
here.
"""

from __future__ import annotations

from libai.models.swin import SwinTransformer, SwinTransformerV2
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import Copy, GroupedFuse, Src


class SwinLoaderHuggerFace(ModelLoaderHuggerFace):
    """Loads ``SwinForImageClassification`` checkpoints, and ``SwinModel`` ones (a
    pretrained backbone: the head keeps a fresh initialization, e.g. with ``num_classes=``)."""

    model_types = ("swin",)
    base_model_prefix = "swin"
    architectures = {"SwinForImageClassification": SwinTransformer}
    ignore_unexpected = (r"embeddings\.mask_token$",)
    optional_missing = (r"^classifier\.",)
    #: v2's config keys and tensors
    v2 = False

    def check_layout(self, libai_cfg: dict) -> None:
        """Every head count runs on every tp (attention is replicated); the MLP widths are
        checked by the model with a message naming the keys."""

    def libai_config(self, hf: dict) -> dict:
        act = hf.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"{hf.get('model_type')} hidden_act={act!r}: only 'gelu' is supported")
        for key in ("image_size", "patch_size"):
            if not isinstance(hf.get(key, 0), int):
                raise ValueError(
                    f"Swin {key}={hf[key]!r}: only square images/patches are supported"
                )
        num_labels = hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
        cfg = dict(
            img_size=hf.get("image_size", 224),
            patch_size=hf.get("patch_size", 4),
            in_chans=hf.get("num_channels", 3),
            num_classes=num_labels,
            embed_dim=hf.get("embed_dim", 96),
            depths=list(hf.get("depths", [2, 2, 6, 2])),
            num_heads=list(hf.get("num_heads", [3, 6, 12, 24])),
            window_size=hf.get("window_size", 7),
            mlp_ratio=hf.get("mlp_ratio", 4.0),
            qkv_bias=hf.get("qkv_bias", True),
            drop_rate=hf.get("hidden_dropout_prob", 0.0),
            attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
            drop_path_rate=hf.get("drop_path_rate", 0.1),
            ape=hf.get("use_absolute_embeddings", False),
            patch_norm=True,
            layernorm_epsilon=hf.get("layer_norm_eps", 1e-5),
        )
        if self.v2:
            cfg["pretrained_window_sizes"] = list(
                hf.get("pretrained_window_sizes") or [0] * len(cfg["depths"])
            )
        return cfg

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        if not cfg["patch_norm"]:
            raise ValueError("transformers' Swin always normalizes the patches: patch_norm=False")
        if cfg.get("qk_scale") is not None:
            raise ValueError(f"transformers' Swin has no qk_scale (got {cfg['qk_scale']})")
        depths = list(cfg["depths"])
        out = dict(
            model_type="swinv2" if cls.v2 else "swin",
            architectures=[cls.hf_architecture(model)],
            image_size=cfg["img_size"],
            patch_size=cfg["patch_size"],
            num_channels=cfg["in_chans"],
            embed_dim=cfg["embed_dim"],
            depths=depths,
            num_layers=len(depths),
            num_heads=list(cfg["num_heads"]),
            window_size=cfg["window_size"],
            mlp_ratio=cfg["mlp_ratio"],
            qkv_bias=cfg["qkv_bias"],
            hidden_dropout_prob=cfg["drop_rate"],
            attention_probs_dropout_prob=cfg["attn_drop_rate"],
            drop_path_rate=cfg["drop_path_rate"],
            hidden_act="gelu",
            use_absolute_embeddings=cfg["ape"],
            layer_norm_eps=cfg["layernorm_epsilon"],
            hidden_size=int(cfg["embed_dim"] * 2 ** (len(depths) - 1)),
            id2label={str(i): f"LABEL_{i}" for i in range(cfg["num_classes"])},
            label2id={f"LABEL_{i}": i for i in range(cfg["num_classes"])},
        )
        if cls.v2:
            out["pretrained_window_sizes"] = list(cfg["pretrained_window_sizes"])
        return out

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        h = f"{cls.base_model_prefix}."
        table = [
            Copy("patch_embed.proj.weight", h + "embeddings.patch_embeddings.projection.weight"),
            Copy("patch_embed.proj.bias", h + "embeddings.patch_embeddings.projection.bias"),
            Copy("patch_embed.norm.weight", h + "embeddings.norm.weight"),
            Copy("patch_embed.norm.bias", h + "embeddings.norm.bias"),
            Copy("norm.weight", h + "layernorm.weight"),
            Copy("norm.bias", h + "layernorm.bias"),
        ]
        if cfg["ape"]:
            table.append(
                Copy("patch_embed.absolute_pos_embed", h + "embeddings.position_embeddings")
            )
        if cfg["num_classes"] > 0:
            table += [
                Copy("head.weight", "classifier.weight"),
                Copy("head.bias", "classifier.bias"),
            ]
        depths, layer = list(cfg["depths"]), 0
        for s, depth in enumerate(depths):
            dim = cfg["embed_dim"] * 2**s
            for j in range(depth):
                table += cls._block_rules(
                    f"layers.{s}.blocks.{layer}.", f"{h}encoder.layers.{s}.blocks.{j}.", dim, cfg
                )
                layer += 1
            if s < len(depths) - 1:
                ours, theirs = f"layers.{s}.downsample.", f"{h}encoder.layers.{s}.downsample."
                table += [
                    Copy(ours + p, theirs + p)
                    for p in ("reduction.weight", "norm.weight", "norm.bias")
                ]
        return table

    @classmethod
    def _block_rules(cls, ours: str, theirs: str, dim: int, cfg: dict) -> list:
        attn = theirs + "attention.self."
        qkv = [_fused_qkv(ours + "attn.qkv.", attn, p, dim) for p in ("weight", "bias")]
        copies = {
            "norm1": "layernorm_before",
            "norm2": "layernorm_after",
            "attn.proj": "attention.output.dense",
            "mlp.dense_h_to_4h": "intermediate.dense",
            "mlp.dense_4h_to_h": "output.dense",
        }
        table = [
            Copy(f"{ours}{a}.{p}", f"{theirs}{b}.{p}")
            for a, b in copies.items()
            for p in ("weight", "bias")
        ]
        table.append(qkv[0])
        if not cls.v2:
            table.append(
                Copy(
                    ours + "attn.relative_position_bias_table",
                    attn + "relative_position_bias_table",
                )
            )
            if cfg["qkv_bias"]:
                table.append(qkv[1])
            return table
        table += [
            Copy(ours + "attn.logit_scale", attn + "logit_scale"),
            Copy(ours + "attn.cpb_mlp.0.weight", attn + "continuous_position_bias_mlp.0.weight"),
            Copy(ours + "attn.cpb_mlp.0.bias", attn + "continuous_position_bias_mlp.0.bias"),
            Copy(ours + "attn.cpb_mlp.2.weight", attn + "continuous_position_bias_mlp.2.weight"),
        ]
        if cfg["qkv_bias"]:
            table.append(Copy(ours + "attn.q_bias", attn + "query.bias"))
            table.append(Copy(ours + "attn.v_bias", attn + "value.bias"))
        return table


def _fused_qkv(ours: str, attn: str, param: str, dim: int) -> GroupedFuse:
    """query / key / value ``param`` -> libai's ``qkv`` rows ``[q; k; v]`` (one group: LiBai's
    Swin layout, not grouped per head)."""
    sources = tuple(Src(f"{attn}{name}.{param}") for name in ("query", "key", "value"))
    return GroupedFuse(ours + param, sources, (dim, dim, dim), 1)


class Swinv2LoaderHuggerFace(SwinLoaderHuggerFace):
    """Loads ``Swinv2ForImageClassification`` checkpoints (and ``Swinv2Model`` backbones)."""

    model_types = ("swinv2",)
    base_model_prefix = "swinv2"
    architectures = {"Swinv2ForImageClassification": SwinTransformerV2}
    v2 = True
