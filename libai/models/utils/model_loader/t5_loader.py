"""T5 and mT5 (``model_type: t5 / mt5``): ``T5ForConditionalGeneration`` /
``MT5ForConditionalGeneration`` <-> :class:`T5ForPreTraining`, ``T5Model`` / ``MT5Model`` <->
:class:`T5Model`.

Tying follows transformers 5: the LM head is tied to ``shared`` unless the checkpoint holds an
``lm_head.weight`` that differs from it (v1.1 / mT5 releases). The decoder output is scaled
by ``d_model ** -0.5`` for T5 when ``scale_decoder_outputs`` (or, in older configs,
``tie_word_embeddings``) says so, never for mT5.
"""

from __future__ import annotations

import torch

from libai.models.t5_model import T5ForPreTraining, T5Model, parse_feed_forward_proj
from libai.models.utils.hf_export import model_libai_cfg
from libai.models.utils.hf_io import CheckpointReader
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import KV, QKV, Copy, expand

_ROWS_PER_READ = 4096


def _distinct_lm_head(path: str) -> bool:
    """Whether the checkpoint has an ``lm_head.weight`` that is not a copy of ``shared``."""
    reader = CheckpointReader(path)
    if "lm_head.weight" not in reader or "shared.weight" not in reader:
        return False
    if reader.shape("lm_head.weight") != reader.shape("shared.weight"):
        return True
    rows = reader.shape("shared.weight")[0]
    for start in range(0, rows, _ROWS_PER_READ):  # bounded memory for big vocabularies
        stop = min(rows, start + _ROWS_PER_READ)
        a = reader.read("lm_head.weight", 0, start, stop)
        b = reader.read("shared.weight", 0, start, stop)
        if not torch.equal(a, b):
            return True
    return False


class T5LoaderHuggerFace(ModelLoaderHuggerFace):
    model_types = ("t5", "mt5")
    base_model_prefix = ""
    architectures = {
        "T5ForConditionalGeneration": T5ForPreTraining,
        "MT5ForConditionalGeneration": T5ForPreTraining,
        "T5Model": T5Model,
        "MT5Model": T5Model,
    }
    ignore_unexpected = (
        r"embed_tokens\.weight$",  # copies of shared.weight
        r"^lm_head\.weight$",  # a base T5Model, or a tied head
        r"EncDecAttention\.relative_attention_bias\.weight$",  # unused by transformers too
    )

    def libai_config(self, hf: dict) -> dict:
        model_type = hf.get("model_type", "t5")
        feed_forward_proj = hf.get("feed_forward_proj", "relu")
        parse_feed_forward_proj(feed_forward_proj)  # raises for what libai cannot run
        tie = not _distinct_lm_head(self.path)
        if model_type == "mt5":
            scale = False
        elif "scale_decoder_outputs" in hf:
            scale = bool(hf["scale_decoder_outputs"])
        else:
            scale = hf.get("tie_word_embeddings", True) is not False
        return dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["d_model"],
            hidden_layers=hf["num_layers"],
            num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
            num_attention_heads=hf["num_heads"],
            head_size=hf["d_kv"],
            ffn_hidden_size=hf["d_ff"],
            relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
            dropout_prob=hf.get("dropout_rate", 0.1),
            layernorm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
            initializer_factor=hf.get("initializer_factor", 1.0),
            feed_forward_proj=feed_forward_proj,
            tie_word_embeddings=tie,
            scale_decoder_outputs=scale,
            model_type=model_type,
            pad_token_id=hf.get("pad_token_id", 0),
            eos_token_id=hf.get("eos_token_id", 1),
            decoder_start_token_id=hf.get("decoder_start_token_id", 0),
        )

    @classmethod
    def hf_architecture(cls, model) -> str:
        prefix = "MT5" if model_libai_cfg(model)["model_type"] == "mt5" else "T5"
        suffix = "ForConditionalGeneration" if isinstance(model, T5ForPreTraining) else "Model"
        return prefix + suffix

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        tie = cfg["tie_word_embeddings"]
        scale = cfg["scale_decoder_outputs"]
        scale = tie if scale is None else scale
        out = dict(
            model_type=cfg["model_type"],
            architectures=[cls.hf_architecture(model)],
            vocab_size=cfg["vocab_size"],
            d_model=cfg["hidden_size"],
            d_kv=cfg["head_size"] or cfg["hidden_size"] // cfg["num_attention_heads"],
            d_ff=cfg["ffn_hidden_size"],
            num_layers=cfg["hidden_layers"],
            num_decoder_layers=cfg["num_decoder_layers"] or cfg["hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            relative_attention_num_buckets=cfg["relative_attention_num_buckets"],
            relative_attention_max_distance=cfg["relative_attention_max_distance"],
            dropout_rate=cfg["dropout_prob"],
            layer_norm_epsilon=cfg["layernorm_epsilon"],
            initializer_factor=cfg["initializer_factor"],
            feed_forward_proj=cfg["feed_forward_proj"],
            tie_word_embeddings=tie,
            is_encoder_decoder=True,
            pad_token_id=cfg["pad_token_id"],
            eos_token_id=cfg["eos_token_id"],
            decoder_start_token_id=cfg["decoder_start_token_id"],
        )
        if cfg["model_type"] == "t5":
            out["scale_decoder_outputs"] = bool(scale)
        elif scale:
            raise ValueError("mT5 in transformers never scales the decoder output")
        return out

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        lm = model_cls is T5ForPreTraining
        p = "t5_model." if lm else ""
        heads = cfg["num_attention_heads"]
        head_size = cfg["head_size"] or cfg["hidden_size"] // heads
        attn = dict(num_heads=heads, head_size=head_size)
        _, gated = parse_feed_forward_proj(cfg["feed_forward_proj"])
        num_encoder = cfg["hidden_layers"]
        num_decoder = cfg["num_decoder_layers"] or num_encoder
        table = [Copy(p + "word_embeddings.weight", "shared.weight")]
        if lm:  # tied: the head's copy on the last pipeline stage; untied: its own weight
            table.append(
                Copy(
                    "lm_head.weight",
                    "shared.weight" if cfg["tie_word_embeddings"] else "lm_head.weight",
                )
            )
        for side, hf_side, num in (
            ("encoder", "encoder", num_encoder),
            ("decoder", "decoder", num_decoder),
        ):
            stack, block = f"{p}{side}.", f"{hf_side}.block."
            rel = f"{hf_side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            layer, hl = stack + "layers.{i}.", block + "{i}.layer."
            ff = "2" if side == "decoder" else "1"
            side_table = [
                Copy(stack + "relative_attention_bias.weight", rel),
                Copy(stack + "final_layernorm.weight", f"{hf_side}.final_layer_norm.weight"),
                Copy(layer + "input_layernorm.weight", hl + "0.layer_norm.weight"),
                QKV(
                    layer + "self_attention.query_key_value.weight",
                    hl + "0.SelfAttention.q.weight",
                    hl + "0.SelfAttention.k.weight",
                    hl + "0.SelfAttention.v.weight",
                    **attn,
                ),
                Copy(layer + "self_attention.dense.weight", hl + "0.SelfAttention.o.weight"),
                Copy(
                    layer + "post_cross_attention_layernorm.weight", hl + ff + ".layer_norm.weight"
                ),
                Copy(layer + "mlp.dense_4h_to_h.weight", hl + ff + ".DenseReluDense.wo.weight"),
            ]
            if gated:
                side_table += [
                    Copy(layer + "mlp.dense_gate.weight", hl + ff + ".DenseReluDense.wi_0.weight"),
                    Copy(
                        layer + "mlp.dense_h_to_4h.weight", hl + ff + ".DenseReluDense.wi_1.weight"
                    ),
                ]
            else:
                side_table.append(
                    Copy(layer + "mlp.dense_h_to_4h.weight", hl + ff + ".DenseReluDense.wi.weight")
                )
            if side == "decoder":
                side_table += [
                    Copy(layer + "post_attention_layernorm.weight", hl + "1.layer_norm.weight"),
                    Copy(layer + "cross_attention.query.weight", hl + "1.EncDecAttention.q.weight"),
                    KV(
                        layer + "cross_attention.key_value.weight",
                        hl + "1.EncDecAttention.k.weight",
                        hl + "1.EncDecAttention.v.weight",
                        num_kv_heads=heads,
                        head_size=head_size,
                    ),
                    Copy(layer + "cross_attention.dense.weight", hl + "1.EncDecAttention.o.weight"),
                ]
            table += expand(side_table, num)
        return table
