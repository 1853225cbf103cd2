"""Tiny GPT-2 / Llama models and batches for the chunked LM loss tests (in-process and torchrun).

GPT-2's head is tied to the word embedding; Llama's is its own weight or tied. The vocab (99)
is not a multiple of 2, so tp2 pads the head and masks the padding columns. The batch has
44 tokens (22 per pipeline micro-batch) and ignored labels; the chunk sizes used (5, 7) divide
neither.
"""

from __future__ import annotations

import torch

from libai import dist
from libai.models import GPTForPreTraining, LlamaForCausalLM
from libai.runtime.parallel import ModelRunner

SEED = 4321
VOCAB = 99
BATCH, SEQ = 4, 11
GPT = dict(
    hidden_layers=2,
    vocab_size=VOCAB,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
)
LLAMA = dict(
    hidden_layers=2,
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
)
#: name -> (class, hyper-parameters, name of the word embedding the tied head copies)
MODELS = {
    "gpt2": (GPTForPreTraining, GPT, "GPT_model.embeddings.token_embeddings.weight"),
    "llama": (LlamaForCausalLM, LLAMA, None),
    "llama-tied": (
        LlamaForCausalLM,
        {**LLAMA, "tie_word_embeddings": True},
        "model.embed_tokens.weight",
    ),
}

#: Relative to each tensor's largest entry. The chunked and the plain loss add the same fp32
#: terms in other orders (per-chunk sums, d W as a sum of per-chunk matmuls, softmax as
#: exp(x - logsumexp) instead of exp(x - max) / sum): a few ulps (fp32 eps 1.2e-7) of the
#: tensor's scale, 5e-7 at worst measured here. 2e-6 leaves 4x margin for other CPUs'
#: kernels; a real bug (a token dropped or counted twice, a wrong scale, a wrong vocab
#: column) moves some gradient entry by O(1) of its scale.
REL_TOL = 2e-6


def build(name: str, chunk: int | None = None):
    cls, cfg, _ = MODELS[name]
    torch.manual_seed(SEED)
    return cls(**cfg, loss_chunk_size=chunk)


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids and labels with ignored (-100) positions, some in every micro-batch half."""
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels[0, :4] = -100
    labels[2, 5:7] = -100
    labels[3, -1] = -100
    return {"input_ids": ids, "labels": labels}


def full_grads(model, name: str) -> dict[str, torch.Tensor]:
    """Every gradient this rank holds, gathered over tp, by the single-process name (a tied
    head's copy on the last stage is named as its word embedding), vocab padding dropped."""
    tied_to = MODELS[name][2]
    out = {}
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        grad = dist.ttol(p.grad.detach()).clone()
        if "embed" in pname or "lm_head" in pname:
            grad = grad[:VOCAB]
        if pname.endswith("lm_head.weight") and tied_to is not None:
            pname = tied_to
        out[pname] = grad
    return out


def run_step(
    model, name: str, batch, *, microbatches: int = 1, amp_dtype=None, on_stage_output=None
) -> dict:
    """One forward-backward through the trainer's runner: the loss and every gradient.
    ``on_stage_output(output)`` sees what each pipeline stage of this rank returns in the
    training step (not the no-grad shape-inference call torch < 2.13 makes first)."""
    runner = ModelRunner(model, num_microbatches=microbatches, amp_dtype=amp_dtype)
    if on_stage_output is not None:
        for stage in runner.stage_schedule.stages:
            stage.submod.register_forward_hook(
                lambda module, args, out: on_stage_output(out) if torch.is_grad_enabled() else None
            )
    loss = runner.forward_backward(batch)
    return {"loss": float(loss), "grads": full_grads(model, name), "runner": runner}


def worst_relative(got: dict, want: dict) -> tuple[float, str]:
    """max over tensors of max|got - want| / max|want|, and that tensor's name."""
    worst, where = 0.0, ""
    for key, value in got.items():
        ref = want[key]
        rel = ((value - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
        if rel > worst:
            worst, where = rel, key
    return worst, where
