"""DeepSeek-V3 (``model_type`` ``deepseek_v3``) <-> libai's Llama family with multi-head latent
attention (:class:`~libai.layers.latent_attention.LatentAttention`) and DeepSeek's
Mixture-of-Experts blocks (sigmoid scores, group-limited routing, the expert bias
``e_score_correction_bias``, shared experts; the first ``first_k_dense_replace`` blocks
dense).

Each expert-parallel rank reads only its experts' tensors; the attention's per-head
projections (``q_b_proj`` / ``q_proj``, ``kv_b_proj``, ``o_proj``) are split over
tensor-parallel ranks by head. RoPE: unscaled, or DeepSeek's YaRN (its released
checkpoints': cos / sin times YaRN's attention factor, the softmax scale times
``mscale(factor, mscale_all_dim) ** 2``).
"""

from __future__ import annotations

from libai.layers import MoEConfig
from libai.layers.rotary import yarn_mscale
from libai.models.llama_model import LlamaForCausalLM, LlamaModel
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.model_loader.llama_loader import rope_settings, swiglu_rules
from libai.models.utils.weight_mapping import Copy, StackedExperts, expand

LATENT = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class DeepseekV3LoaderHuggerFace(ModelLoaderHuggerFace):
    """Hugging Face DeepSeek-V3 checkpoints <-> libai Llama models with MLA and MoE blocks."""

    model_types = ("deepseek_v3",)
    base_model_prefix = "model"
    architectures = {"DeepseekV3ForCausalLM": LlamaForCausalLM, "DeepseekV3Model": LlamaModel}
    ignore_unexpected = (r"rotary_emb\.inv_freq$", r"^lm_head\.weight$")

    def libai_config(self, hf: dict) -> dict:
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"deepseek_v3 hidden_act={act!r} is not supported (only 'silu')")
        theta, scaling = rope_settings(hf)
        if scaling is not None and scaling.get("rope_type") != "yarn":
            raise ValueError(
                f"deepseek_v3 with rope scaling {scaling.get('rope_type')!r} is not supported; "
                "unscaled or YaRN (DeepSeek's) RoPE is"
            )
        heads = hf["num_attention_heads"]
        qk_head = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
        softmax_scale = qk_head**-0.5
        if scaling is not None and scaling.get("mscale_all_dim"):  # DeepSeek's YaRN scale
            softmax_scale *= yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
        if (hf.get("num_key_value_heads") or heads) != heads:
            raise ValueError("deepseek_v3 latent attention has one key/value head per head")
        per_expert = hf["moe_intermediate_size"]
        return dict(
            model_type="deepseek_v3",
            hidden_layers=hf["num_hidden_layers"],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            initializer_range=hf.get("initializer_range", 0.02),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bool(hf.get("attention_bias", False)),
            attention_dropout_prob=hf.get("attention_dropout", 0.0),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            padding_idx=hf.get("pad_token_id"),
            latent_attention={
                **{k: hf.get(k) for k in LATENT},
                "rope_interleave": bool(hf.get("rope_interleave", True)),
                "softmax_scale": softmax_scale,
            },
            moe=dict(
                num_experts=hf["n_routed_experts"],
                top_k=hf["num_experts_per_tok"],
                expert_ffn_hidden_size=per_expert,
                score_func="sigmoid",
                norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
                routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
                num_groups=hf.get("n_group") or 1,
                topk_groups=hf.get("topk_group") or 1,
                expert_bias=True,
                shared_expert_ffn_hidden_size=(hf.get("n_shared_experts") or 0) * per_expert,
                first_dense_layers=hf.get("first_k_dense_replace") or 0,
            ),
        )

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        moe = MoEConfig.of(cfg["moe"])
        latent = dict(cfg["latent_attention"])
        per_expert = moe.expert_ffn_hidden_size or cfg["intermediate_size"]
        theta = float(cfg["rope_theta"])
        scaling = dict(cfg.get("rope_scaling") or {})
        return dict(
            model_type="deepseek_v3",
            architectures=[cls.hf_architecture(model)],
            num_hidden_layers=cfg["hidden_layers"],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            moe_intermediate_size=per_expert,
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_attention_heads"],
            max_position_embeddings=cfg["max_position_embeddings"],
            rms_norm_eps=cfg["rms_norm_eps"],
            initializer_range=cfg["initializer_range"],
            rope_theta=theta,
            rope_parameters={"rope_theta": theta, "rope_type": "default", **scaling},
            rope_scaling=scaling or None,
            attention_bias=bool(cfg["attention_bias"]),
            attention_dropout=cfg["attention_dropout_prob"],
            tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
            hidden_act="silu",
            **{k: latent.get(k) for k in LATENT},
            rope_interleave=bool(latent.get("rope_interleave", True)),
            n_routed_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            norm_topk_prob=moe.norm_topk_prob,
            routed_scaling_factor=moe.routed_scaling_factor,
            n_group=moe.num_groups,
            topk_group=moe.topk_groups or moe.num_groups,
            n_shared_experts=moe.shared_expert_ffn_hidden_size // per_expert,
            first_k_dense_replace=moe.first_dense_layers,
        )

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        lm = model_cls is LlamaForCausalLM
        p = "model." if lm else ""
        layer = p + "layers.{i}."
        attn, hf_attn = layer + "self_attention.", layer + "self_attn."
        latent = dict(cfg["latent_attention"])
        table = [
            Copy(p + "embed_tokens.weight", p + "embed_tokens.weight"),
            Copy(p + "norm.weight", p + "norm.weight"),
            Copy(layer + "input_layernorm.weight", layer + "input_layernorm.weight"),
            Copy(
                layer + "post_cross_attention_layernorm.weight",
                layer + "post_attention_layernorm.weight",
            ),
            Copy(attn + "kv_a_proj_with_mqa.weight", hf_attn + "kv_a_proj_with_mqa.weight"),
            Copy(attn + "kv_a_layernorm.weight", hf_attn + "kv_a_layernorm.weight"),
            Copy(attn + "kv_b_proj.weight", hf_attn + "kv_b_proj.weight"),
            Copy(attn + "dense.weight", hf_attn + "o_proj.weight"),
        ]
        if latent.get("q_lora_rank"):
            table += [
                Copy(attn + f"q_a_proj.{w}", hf_attn + f"q_a_proj.{w}")
                for w in (["weight", "bias"] if cfg["attention_bias"] else ["weight"])
            ]
            table += [
                Copy(attn + "q_a_layernorm.weight", hf_attn + "q_a_layernorm.weight"),
                Copy(attn + "q_b_proj.weight", hf_attn + "q_b_proj.weight"),
            ]
        else:
            table.append(Copy(attn + "q_proj.weight", hf_attn + "q_proj.weight"))
        if cfg["attention_bias"]:
            table += [
                Copy(attn + "kv_a_proj_with_mqa.bias", hf_attn + "kv_a_proj_with_mqa.bias"),
                Copy(attn + "dense.bias", hf_attn + "o_proj.bias"),
            ]
        if lm:
            head_src = (
                "lm_head.weight" if not cfg["tie_word_embeddings"] else p + "embed_tokens.weight"
            )
            table.append(Copy("lm_head.weight", head_src))
        table = expand(table, cfg["hidden_layers"])
        moe = MoEConfig.of(cfg["moe"])
        for i in range(cfg["hidden_layers"]):
            mlp = f"{p}layers.{i}.mlp."
            if not moe.is_moe_layer(i):
                table += swiglu_rules(mlp, mlp)
                continue
            experts = mlp + "experts.<e>."
            n = moe.num_experts
            table += [
                Copy(mlp + "router.weight", mlp + "gate.weight"),
                Copy(mlp + "router.expert_bias", mlp + "gate.e_score_correction_bias"),
                StackedExperts(mlp + "experts.w_gate", experts + "gate_proj.weight", n),
                StackedExperts(mlp + "experts.w_up", experts + "up_proj.weight", n),
                StackedExperts(mlp + "experts.w_down", experts + "down_proj.weight", n),
            ]
            if moe.shared_expert_ffn_hidden_size:
                table += swiglu_rules(mlp + "shared_experts.", mlp + "shared_experts.")
        return table
