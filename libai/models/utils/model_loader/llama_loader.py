"""Llama, Qwen2 and Qwen3 (``model_type`` ``llama`` / ``qwen2`` / ``qwen3``) <-> libai
:mod:`libai.models.llama_model`.

``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` load into :class:`LlamaForCausalLM`, ``LlamaModel`` /
``Qwen2Model`` into :class:`LlamaModel`. RoPE settings are read from either spelling of
``config.json``: transformers 5's ``rope_parameters`` (with ``rope_theta`` inside) or the older
top-level ``rope_theta`` + ``rope_scaling``; an export writes both, so old and new
transformers rebuild the same model.
"""

from __future__ import annotations

from collections.abc import Mapping

from libai.models.llama_model import LlamaForCausalLM, LlamaModel
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import QKV, Copy, expand


def _plain(value):
    """OmegaConf containers (from a LazyConfig) -> plain dicts for config.json."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def rope_settings(hf: dict) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` from a ``config.json``, in either spelling.

    ``rope_scaling`` is ``None`` for plain RoPE, else a dict with ``rope_type`` and that
    type's fields (llama3's ``original_max_position_embeddings`` defaults to
    ``max_position_embeddings``, as in transformers).
    """
    params = hf.get("rope_parameters")
    if params:
        params = dict(params)
        if any(isinstance(v, Mapping) for v in params.values()):
            raise ValueError(f"per-layer-type rope_parameters are not supported: {sorted(params)}")
        theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        theta = hf.get("rope_theta", 10000.0)
        params = dict(hf.get("rope_scaling") or {})
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind == "default":
        return float(theta), None
    if kind == "llama3":
        params.setdefault(
            "original_max_position_embeddings",
            hf.get("original_max_position_embeddings", hf.get("max_position_embeddings")),
        )
    return float(theta), {"rope_type": kind, **params}


def swiglu_rules(libai: str, hf: str) -> list:
    """A SwiGLU MLP's three weights: libai's ``dense_gate`` / ``dense_h_to_4h`` /
    ``dense_4h_to_h`` under ``libai`` from transformers' ``gate_proj`` / ``up_proj`` /
    ``down_proj`` under ``hf``."""
    return [
        Copy(libai + "dense_gate.weight", hf + "gate_proj.weight"),
        Copy(libai + "dense_h_to_4h.weight", hf + "up_proj.weight"),
        Copy(libai + "dense_4h_to_h.weight", hf + "down_proj.weight"),
    ]


class LlamaLoaderHuggerFace(ModelLoaderHuggerFace):
    """Hugging Face Llama / Qwen2 checkpoints <-> libai Llama models (any layout)."""

    model_types = ("llama", "qwen2", "qwen3")
    base_model_prefix = "model"
    architectures = {
        "LlamaForCausalLM": LlamaForCausalLM,
        "LlamaModel": LlamaModel,
        "Qwen2ForCausalLM": LlamaForCausalLM,
        "Qwen2Model": LlamaModel,
        "Qwen3ForCausalLM": LlamaForCausalLM,
        "Qwen3Model": LlamaModel,
    }
    ignore_unexpected = (r"rotary_emb\.inv_freq$", r"^lm_head\.weight$")

    def libai_config(self, hf: dict) -> dict:
        model_type = hf["model_type"]
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{model_type} hidden_act={act!r} is not supported (only 'silu')")
        if model_type in ("qwen2", "qwen3"):
            sliding = hf.get("use_sliding_window") or "sliding_attention" in (
                hf.get("layer_types") or ()
            )
            if sliding:
                raise ValueError(
                    f"{model_type} with use_sliding_window=true (sliding-window attention "
                    "layers) is not supported; only full attention is."
                )
        theta, scaling = rope_settings(hf)
        heads = hf["num_attention_heads"]
        qwen2 = model_type == "qwen2"
        return dict(
            model_type=model_type,
            hidden_layers=hf["num_hidden_layers"],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            initializer_range=hf.get("initializer_range", 0.02),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=False if qwen2 else bool(hf.get("attention_bias", False)),
            qkv_bias=qwen2,  # Qwen2 always has q/k/v biases (and none elsewhere)
            mlp_bias=False if qwen2 else bool(hf.get("mlp_bias", False)),
            attention_dropout_prob=hf.get("attention_dropout", 0.0),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen3: q_norm / k_norm per head
            qk_norm="head" if model_type == "qwen3" else None,
            # transformers: nn.Embedding(vocab, hidden, padding_idx=pad_token_id)
            padding_idx=hf.get("pad_token_id"),
        )

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        model_type = cfg.get("model_type", "llama")
        qkv_bias = cfg["qkv_bias"] or cfg["attention_bias"]
        if model_type == "qwen2" and (not qkv_bias or cfg["attention_bias"] or cfg["mlp_bias"]):
            raise ValueError(
                "a qwen2 export needs qkv_bias=True, attention_bias=False and mlp_bias=False "
                "(Qwen2's fixed layout)"
            )
        if model_type == "llama" and qkv_bias != cfg["attention_bias"]:
            raise ValueError(
                "Llama's attention_bias covers q, k, v and o together; biases on q/k/v only "
                "(qkv_bias=True) are Qwen2's layout: set model_type='qwen2'"
            )
        if model_type == "qwen3" and cfg.get("qk_norm") != "head":
            raise ValueError("a qwen3 export needs qk_norm='head' (Qwen3's q_norm / k_norm)")
        arch = cls.hf_architecture(model)
        if model_type in ("qwen2", "qwen3"):
            arch = arch.replace("Llama", "Qwen2" if model_type == "qwen2" else "Qwen3")
        scaling = _plain(cfg.get("rope_scaling")) or None
        theta = float(cfg["rope_theta"])
        rope_parameters = {"rope_theta": theta, "rope_type": "default"}
        if scaling:
            rope_parameters.update(scaling)
        out = dict(
            model_type=model_type,
            architectures=[arch],
            num_hidden_layers=cfg["hidden_layers"],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"] or cfg["num_attention_heads"],
            head_dim=cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"],
            max_position_embeddings=cfg["max_position_embeddings"],
            rms_norm_eps=cfg["rms_norm_eps"],
            initializer_range=cfg["initializer_range"],
            rope_theta=theta,
            rope_scaling=scaling,
            rope_parameters=rope_parameters,
            hidden_act="silu",
            attention_dropout=cfg["attention_dropout_prob"],
            tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        )
        if model_type in ("qwen2", "qwen3"):
            layers = cfg["hidden_layers"]
            out.update(
                use_sliding_window=False,
                sliding_window=None,
                layer_types=["full_attention"] * layers,
            )
        if model_type == "qwen3":
            out.update(attention_bias=bool(cfg["attention_bias"]))
        elif model_type == "llama":
            out.update(attention_bias=bool(cfg["attention_bias"]), mlp_bias=bool(cfg["mlp_bias"]))
        return out

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        lm = model_cls is LlamaForCausalLM
        p = "model." if lm else ""  # libai and transformers share the names up to the layers
        layer, hl = p + "layers.{i}.", p + "layers.{i}."
        heads = cfg["num_attention_heads"]
        kv_heads = cfg["num_key_value_heads"] or heads
        head_size = cfg["head_dim"] or cfg["hidden_size"] // heads
        qkv = dict(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size)
        attn, mlp = hl + "self_attn.", hl + "mlp."
        table = [
            Copy(p + "embed_tokens.weight", p + "embed_tokens.weight"),
            Copy(p + "norm.weight", p + "norm.weight"),
            Copy(layer + "input_layernorm.weight", hl + "input_layernorm.weight"),
            QKV(
                layer + "self_attention.query_key_value.weight",
                attn + "q_proj.weight",
                attn + "k_proj.weight",
                attn + "v_proj.weight",
                **qkv,
            ),
            Copy(layer + "self_attention.dense.weight", attn + "o_proj.weight"),
            Copy(
                layer + "post_cross_attention_layernorm.weight",
                hl + "post_attention_layernorm.weight",
            ),
            *swiglu_rules(layer + "mlp.", mlp),
        ]
        if cfg["qkv_bias"] or cfg["attention_bias"]:
            table.append(
                QKV(
                    layer + "self_attention.query_key_value.bias",
                    attn + "q_proj.bias",
                    attn + "k_proj.bias",
                    attn + "v_proj.bias",
                    **qkv,
                )
            )
        if cfg["attention_bias"]:
            table.append(Copy(layer + "self_attention.dense.bias", attn + "o_proj.bias"))
        if cfg.get("qk_norm"):
            table += [
                Copy(layer + "self_attention.q_norm.weight", attn + "q_norm.weight"),
                Copy(layer + "self_attention.k_norm.weight", attn + "k_norm.weight"),
            ]
        if cfg["mlp_bias"]:
            table += [
                Copy(layer + "mlp.dense_gate.bias", mlp + "gate_proj.bias"),
                Copy(layer + "mlp.dense_h_to_4h.bias", mlp + "up_proj.bias"),
                Copy(layer + "mlp.dense_4h_to_h.bias", mlp + "down_proj.bias"),
            ]
        if lm:
            # untied: the head's own weight; tied: the copy on the last pipeline stage
            head_src = (
                "lm_head.weight" if not cfg["tie_word_embeddings"] else p + "embed_tokens.weight"
            )
            table.append(Copy("lm_head.weight", head_src))
        return expand(table, cfg["hidden_layers"])
