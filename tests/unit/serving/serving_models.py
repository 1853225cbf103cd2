"""Tiny random Hugging Face models saved locally, for the serving tests."""

from __future__ import annotations

import torch
import transformers

VOCAB = 97


def tiny_hf(kind: str, directory) -> transformers.PreTrainedModel:
    """A tiny random ``kind`` ("llama" or "gpt2") saved to ``directory`` (fp32)."""
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            initializer_range=0.2,  # peaked distributions: greedy far from ties
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
            initializer_range=0.2,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    model.eval().save_pretrained(directory)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()


def make_peft_adapter(base_dir, out_dir, seed: int, **lora) -> str:
    """A PEFT LoRA adapter made by ``peft`` on the Hugging Face model at ``base_dir``, its
    A and B random (PEFT starts one of them at zero, which would change nothing), saved to
    ``out_dir``."""
    import peft

    model = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(base_dir), peft.LoraConfig(**lora)
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(out_dir)
    return str(out_dir)


def peft_model(base_dir, adapter_dir):
    """transformers + PEFT: the base at ``base_dir`` with the adapter at ``adapter_dir``."""
    import peft

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    return peft.PeftModel.from_pretrained(base, adapter_dir).eval()
