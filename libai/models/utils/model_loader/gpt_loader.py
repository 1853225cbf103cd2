"""GPT-2 (``model_type: gpt2``): ``GPT2Model`` / ``GPT2LMHeadModel`` <-> libai GPT."""

from __future__ import annotations

from libai.models.gpt_model import GPTForPreTraining, GPTModel
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace
from libai.models.utils.weight_mapping import QKV, Copy, Src, expand

#: transformers' activation names -> libai's
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


class GPT2LoaderHuggerFace(ModelLoaderHuggerFace):
    model_types = ("gpt2",)
    base_model_prefix = "transformer"
    architectures = {"GPT2LMHeadModel": GPTForPreTraining, "GPT2Model": GPTModel}
    ignore_unexpected = (r"attn\.bias$", r"attn\.masked_bias$", r"^lm_head\.weight$")

    def libai_config(self, hf: dict) -> dict:
        act = hf.get("activation_function", "gelu_new")
        if act not in ACTIVATIONS:
            raise ValueError(
                f"GPT-2 activation_function={act!r} is not supported: {sorted(ACTIVATIONS)}"
            )
        return dict(
            hidden_layers=hf["n_layer"],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["n_embd"],
            ffn_hidden_size=hf.get("n_inner") or 4 * hf["n_embd"],
            num_attention_heads=hf["n_head"],
            max_seq_length=hf["n_positions"],
            embedding_dropout_prob=hf.get("embd_pdrop", 0.1),
            attention_dropout_prob=hf.get("attn_pdrop", 0.1),
            output_dropout_prob=hf.get("resid_pdrop", 0.1),
            layernorm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
            initializer_range=hf.get("initializer_range", 0.02),
            activation=ACTIVATIONS[act],
        )

    @classmethod
    def hf_config(cls, cfg: dict, model) -> dict:
        if cfg.get("moe") and dict(cfg["moe"]).get("num_experts"):
            raise ValueError(
                "a GPT with Mixture-of-Experts blocks (model.cfg.moe) has no Hugging Face "
                "GPT-2 counterpart to export to; save a libai checkpoint instead"
            )
        return dict(
            model_type="gpt2",
            architectures=[cls.hf_architecture(model)],
            n_layer=cfg["hidden_layers"],
            vocab_size=cfg["vocab_size"],
            n_embd=cfg["hidden_size"],
            n_inner=cfg["ffn_hidden_size"],
            n_head=cfg["num_attention_heads"],
            n_positions=cfg["max_seq_length"],
            embd_pdrop=cfg["embedding_dropout_prob"],
            attn_pdrop=cfg["attention_dropout_prob"],
            resid_pdrop=cfg["output_dropout_prob"],
            layer_norm_epsilon=cfg["layernorm_epsilon"],
            initializer_range=cfg["initializer_range"],
            activation_function={"gelu_tanh": "gelu_new", "gelu": "gelu"}[cfg["activation"]],
            tie_word_embeddings=True,
        )

    @classmethod
    def rules(cls, cfg: dict, model_cls: type) -> list:
        lm = model_cls is GPTForPreTraining
        p = "GPT_model." if lm else ""
        h = "transformer." if lm else ""
        layer, hl = p + "transformer.layers.{i}.", h + "h.{i}."
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        qkv = dict(num_heads=heads, head_size=hidden // heads)

        def fused(name):  # c_attn is [q; k; v] along its output dim (a Conv1D: [in, out])
            return [
                Src(name, offset=i * hidden, transpose=name.endswith("weight")) for i in range(3)
            ]

        table = [
            Copy(p + "embeddings.token_embeddings.weight", h + "wte.weight"),
            Copy(p + "embeddings.position_embeddings.weight", h + "wpe.weight"),
            Copy(p + "lm_head.weight", h + "wte.weight"),  # the tied copy on the last stage
            Copy(p + "transformer.layernorm_f.weight", h + "ln_f.weight"),
            Copy(p + "transformer.layernorm_f.bias", h + "ln_f.bias"),
            Copy(layer + "input_layernorm.weight", hl + "ln_1.weight"),
            Copy(layer + "input_layernorm.bias", hl + "ln_1.bias"),
            QKV(
                layer + "self_attention.query_key_value.weight",
                *fused(hl + "attn.c_attn.weight"),
                **qkv,
            ),
            QKV(
                layer + "self_attention.query_key_value.bias",
                *fused(hl + "attn.c_attn.bias"),
                **qkv,
            ),
            Copy(layer + "self_attention.dense.weight", hl + "attn.c_proj.weight", transpose=True),
            Copy(layer + "self_attention.dense.bias", hl + "attn.c_proj.bias"),
            Copy(layer + "post_cross_attention_layernorm.weight", hl + "ln_2.weight"),
            Copy(layer + "post_cross_attention_layernorm.bias", hl + "ln_2.bias"),
            Copy(layer + "mlp.dense_h_to_4h.weight", hl + "mlp.c_fc.weight", transpose=True),
            Copy(layer + "mlp.dense_h_to_4h.bias", hl + "mlp.c_fc.bias"),
            Copy(layer + "mlp.dense_4h_to_h.weight", hl + "mlp.c_proj.weight", transpose=True),
            Copy(layer + "mlp.dense_4h_to_h.bias", hl + "mlp.c_proj.bias"),
        ]
        return expand(table, cfg["hidden_layers"])
