"""Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (``model_type`` ``mixtral`` / ``qwen2_moe`` /
``qwen3_moe`` / ``olmoe``) <-> libai's Llama family with Mixture-of-Experts blocks
(:class:`~libai.layers.MoE`).

The attention, norms and embeddings are Llama's (Mixtral), Qwen2's (Qwen2-MoE: q/k/v
biases), Qwen3's (Qwen3-MoE: per-head q/k norms) or OLMoE's (q/k norms over all heads); the
feed-forward of the MoE blocks is a router (``gate``) and stacked experts, read one Hugging
Face tensor per expert, each expert-parallel rank reading only its own experts
(:class:`~libai.models.utils.weight_mapping.StackedExperts`). Qwen2-MoE adds a shared expert
with a sigmoid gate; the Qwen families have dense blocks where ``decoder_sparse_step`` /
``mlp_only_layers`` say.
"""

from __future__ import annotations

from libai.layers import MoEConfig
from libai.models.llama_model import LlamaForCausalLM, LlamaModel
from libai.models.utils.model_loader.llama_loader import LlamaLoaderHuggerFace, swiglu_rules
from libai.models.utils.weight_mapping import Copy, StackedExperts

#: each MoE family's attention layout (the Llama loader's model_type)
BASE_TYPE = {"mixtral": "llama", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "olmoe": "llama"}
PREFIX = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}


def _aux_coeff(hf: dict) -> float:
    """transformers adds the load-balancing loss only with ``output_router_logits``."""
    return float(hf.get("router_aux_loss_coef", 0.0)) if hf.get("output_router_logits") else 0.0


class MoELoaderHuggerFace(LlamaLoaderHuggerFace):
    """Hugging Face Mixtral / Qwen2-MoE checkpoints <-> libai Llama models with MoE blocks."""

    model_types = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
    architectures = {
        "MixtralForCausalLM": LlamaForCausalLM,
        "MixtralModel": LlamaModel,
        "Qwen2MoeForCausalLM": LlamaForCausalLM,
        "Qwen2MoeModel": LlamaModel,
        "Qwen3MoeForCausalLM": LlamaForCausalLM,
        "Qwen3MoeModel": LlamaModel,
        "OlmoeForCausalLM": LlamaForCausalLM,
        "OlmoeModel": LlamaModel,
    }

    def libai_config(self, hf: dict) -> dict:
        model_type = hf["model_type"]
        if float(hf.get("router_jitter_noise") or 0.0):
            raise ValueError(
                f"{model_type} router_jitter_noise={hf['router_jitter_noise']} is not "
                "supported (routing here is deterministic); set it to 0"
            )
        window = hf.get("sliding_window")
        if model_type == "mixtral" and window and window < hf.get("max_position_embeddings", 0):
            raise ValueError(
                f"Mixtral with sliding_window={window} (sliding-window attention) is not "
                "supported; only full attention is (sliding_window: null)"
            )
        if model_type == "olmoe" and hf.get("clip_qkv") is not None:
            raise ValueError(
                f"OLMoE with clip_qkv={hf['clip_qkv']} (clamped q/k/v) is not supported; "
                "set clip_qkv: null"
            )
        cfg = super().libai_config({**hf, "model_type": BASE_TYPE[model_type]})
        if model_type == "mixtral":
            moe = dict(
                num_experts=hf["num_local_experts"],
                top_k=hf["num_experts_per_tok"],
                norm_topk_prob=True,
            )
        elif model_type == "olmoe":  # every block MoE; q/k norms over all heads
            moe = dict(
                num_experts=hf["num_experts"],
                top_k=hf["num_experts_per_tok"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            )
            cfg["qk_norm"] = "full"
        else:  # Qwen-MoE (Qwen3-MoE's count is num_local_experts in transformers 5)
            moe = dict(
                num_experts=hf.get("num_experts") or hf["num_local_experts"],
                top_k=hf["num_experts_per_tok"],
                expert_ffn_hidden_size=hf["moe_intermediate_size"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                shared_expert_ffn_hidden_size=hf.get("shared_expert_intermediate_size") or 0,
                shared_expert_gate=bool(hf.get("shared_expert_intermediate_size")),
                layer_freq=hf.get("decoder_sparse_step", 1),
                dense_layers=list(hf.get("mlp_only_layers") or ()),
            )
        return {**cfg, "model_type": model_type, "moe": {**moe, "aux_loss_coeff": _aux_coeff(hf)}}

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        model_type = cfg["model_type"]
        out = super().hf_config({**cfg, "model_type": BASE_TYPE[model_type]}, model)
        arch = cls.hf_architecture(model)
        moe = MoEConfig.of(cfg["moe"])
        out.update(model_type=model_type, architectures=[arch], num_experts_per_tok=moe.top_k)
        if moe.aux_loss_coeff:  # else the source's coefficient (unused while off) carries over
            out.update(router_aux_loss_coef=moe.aux_loss_coeff, output_router_logits=True)
        if out.get("head_dim") == cfg["hidden_size"] // cfg["num_attention_heads"]:
            out.pop("head_dim")  # the families' default (their configs write null)
        if model_type == "mixtral":
            out.update(num_local_experts=moe.num_experts, router_jitter_noise=0.0)
            out.pop("attention_bias", None), out.pop("mlp_bias", None)
            out["sliding_window"] = None
        elif model_type == "olmoe":
            out.update(num_experts=moe.num_experts, norm_topk_prob=moe.norm_topk_prob)
            out.update(clip_qkv=None)
            out.pop("mlp_bias", None)
        else:
            out.update(
                num_experts=moe.num_experts,
                moe_intermediate_size=moe.expert_ffn_hidden_size or cfg["intermediate_size"],
                norm_topk_prob=moe.norm_topk_prob,
                decoder_sparse_step=moe.layer_freq,
                mlp_only_layers=list(moe.dense_layers),
            )
            if model_type == "qwen2_moe":
                out.update(shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size)
            else:  # transformers 5's name, and the older one
                out.update(num_local_experts=moe.num_experts)
        return out

    @classmethod
    def hf_architecture(cls, model) -> str:
        cfg = model.libai_cfg if isinstance(model, LlamaModel) else model.model.libai_cfg
        suffix = "ForCausalLM" if isinstance(model, LlamaForCausalLM) else "Model"
        return PREFIX[cfg["model_type"]] + suffix

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        model_type = cfg["model_type"]
        table = super().rules({**cfg, "model_type": BASE_TYPE[model_type]}, model_cls)
        moe = MoEConfig.of(cfg["moe"])
        p = "model." if model_cls is LlamaForCausalLM else ""
        moe_layers = [i for i in range(cfg["hidden_layers"]) if moe.is_moe_layer(i)]
        dense_mlps = tuple(f"{p}layers.{i}.mlp." for i in moe_layers)
        table = [r for r in table if not r.libai_name.startswith(dense_mlps)]
        for i in moe_layers:
            table += cls._moe_rules(f"{p}layers.{i}.mlp.", model_type, moe)
        return table

    @staticmethod
    def _moe_rules(mlp: str, model_type: str, moe: MoEConfig) -> list:
        n = moe.num_experts
        if model_type == "mixtral":  # the others: Qwen-MoE's names
            hf = mlp.replace(".mlp.", ".block_sparse_moe.")
            experts = hf + "experts.<e>."
            return [
                Copy(mlp + "router.weight", hf + "gate.weight"),
                StackedExperts(mlp + "experts.w_gate", experts + "w1.weight", n),
                StackedExperts(mlp + "experts.w_up", experts + "w3.weight", n),
                StackedExperts(mlp + "experts.w_down", experts + "w2.weight", n),
            ]
        experts = mlp + "experts.<e>."
        rules = [
            Copy(mlp + "router.weight", mlp + "gate.weight"),
            StackedExperts(mlp + "experts.w_gate", experts + "gate_proj.weight", n),
            StackedExperts(mlp + "experts.w_up", experts + "up_proj.weight", n),
            StackedExperts(mlp + "experts.w_down", experts + "down_proj.weight", n),
        ]
        if moe.shared_expert_ffn_hidden_size:
            rules += swiglu_rules(mlp + "shared_experts.", mlp + "shared_expert.")
            rules.append(Copy(mlp + "shared_expert_gate.weight", mlp + "shared_expert_gate.weight"))
        return rules
