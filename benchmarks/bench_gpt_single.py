"""libai's GPT on one process (tp = 1) against a plain-PyTorch GPT-2 of the same shapes.

The single-device path must not pay for the global-tensor machinery: the target is a libai
training step of at most 1.05x the plain model's. Both models are built in the same process,
start from the *same weights* (libai's are copied into the plain model and the initial losses
are checked to agree), train on the same batches with the same AdamW settings (their losses are
checked to stay together), and are timed in interleaved blocks (A B, B A, A B, ...) so that
whatever else the machine does hits both alike. A step is forward + backward +
``optimizer.step()`` + ``zero_grad`` + reading the loss as a float; libai's goes through
``ModelRunner(model).train_step(batch, optimizer)``, the trainer's own path.

The verdict is the median, over pairs of adjacent blocks, of libai's median step time over the
plain model's in that pair; the table gives each model's median step over all timed steps.

    python benchmarks/bench_gpt_single.py              # moderate shape, ~1 min on 2 cores
    python benchmarks/bench_gpt_single.py --tiny       # per-op (Python) overhead dominates
    python benchmarks/bench_gpt_single.py --layers 8 --hidden 512 --heads 8 --seq 512
    python benchmarks/bench_gpt_single.py --tiny --strict   # exit 1 if the target is missed
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import Contender, block_pair_ratios, print_step_table, run_interleaved
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libai import dist  # noqa: E402
from libai.models import GPTForPreTraining  # noqa: E402
from libai.runtime.parallel import ModelRunner  # noqa: E402

TARGET_RATIO = 1.05


# ---- a plain GPT-2, nanoGPT style ----------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.hidden, self.heads = hidden, heads
        self.qkv = nn.Linear(hidden, 3 * hidden)  # rows: [Q_all; K_all; V_all]
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q = q.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc = nn.Linear(hidden, ffn)
        self.proj = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, layers, vocab, hidden, heads, ffn, max_seq, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, input_ids, labels):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


@torch.no_grad()
def copy_libai_weights(libai_model: GPTForPreTraining, plain: PlainGPT, heads: int) -> None:
    """Load libai's (tp = 1, plain-tensor) parameters into the plain model."""
    gpt = libai_model.GPT_model

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        assert dst.shape == src.shape, (dst.shape, src.shape)
        dst.copy_(src)

    def qkv_rows(t: torch.Tensor) -> torch.Tensor:
        # libai groups the fused rows per head: [q_h; k_h; v_h] for h = 0..heads-1
        # nanoGPT's layout is [Q_all; K_all; V_all]
        return t.view(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    put(plain.wte.weight, gpt.embeddings.token_embeddings.weight)
    put(plain.wpe.weight, gpt.embeddings.position_embeddings.weight)
    for block, layer in zip(plain.blocks, gpt.transformer.layers.values()):
        attn, mlp = layer.self_attention, layer.mlp
        put(block.ln_1.weight, layer.input_layernorm.weight)
        put(block.ln_1.bias, layer.input_layernorm.bias)
        put(block.attn.qkv.weight, qkv_rows(attn.query_key_value.weight))
        put(block.attn.qkv.bias, qkv_rows(attn.query_key_value.bias))
        put(block.attn.proj.weight, attn.dense.weight)
        put(block.attn.proj.bias, attn.dense.bias)
        put(block.ln_2.weight, layer.post_cross_attention_layernorm.weight)
        put(block.ln_2.bias, layer.post_cross_attention_layernorm.bias)
        put(block.mlp.fc.weight, mlp.dense_h_to_4h.weight)
        put(block.mlp.fc.bias, mlp.dense_h_to_4h.bias)
        put(block.mlp.proj.weight, mlp.dense_4h_to_h.weight)
        put(block.mlp.proj.bias, mlp.dense_4h_to_h.bias)
    put(plain.ln_f.weight, gpt.transformer.layernorm_f.weight)
    put(plain.ln_f.bias, gpt.transformer.layernorm_f.bias)
    n_libai = sum(p.numel() for p in libai_model.parameters())
    n_plain = sum(p.numel() for p in plain.parameters())
    assert n_libai == n_plain, (n_libai, n_plain)


# ---- benchmark --------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--ffn", type=int, default=None, help="default: 4 x hidden")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument(
        "--tiny",
        action="store_true",
        help="2 layers, hidden 64, 4 heads, vocab 512, seq 32, batch 4",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps per block")
    p.add_argument("--repeats", type=int, default=None, help="timed blocks per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--strict", action="store_true", help="exit 1 if the target is missed")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.vocab = 2, 64, 4, 512
        args.seq, args.batch = 32, 4
    args.ffn = args.ffn or 4 * args.hidden
    if args.steps is None:
        args.steps = 20 if args.tiny else 2
    if args.repeats is None:
        args.repeats = 50 if args.tiny else 24
    return args


def make_batches(args, n: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(args.seed + 1)
    batches = []
    for _ in range(n):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        batches.append(
            {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
        )
    return batches


def adamw(model, lr):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)


def plain_step(model):
    def step(batch, optimizer):
        loss = model(batch["input_ids"], batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main(args: argparse.Namespace) -> float:
    """Build, check and time both models; print the figures; return the libai/plain ratio."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.setup_dist_util({})  # one process: tp = dp = pp = 1

    torch.manual_seed(args.seed)
    libai_model = GPTForPreTraining(
        hidden_layers=args.layers,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        ffn_hidden_size=args.ffn,
        num_attention_heads=args.heads,
        max_seq_length=args.seq,
    )
    plain_model = PlainGPT(args.layers, args.vocab, args.hidden, args.heads, args.ffn, args.seq)
    copy_libai_weights(libai_model, plain_model, args.heads)
    libai_model.train()
    plain_model.train()

    batches = make_batches(args)
    with torch.no_grad():
        b = batches[0]
        l_libai = float(libai_model(**b)["lm_loss"])
        l_plain = float(plain_model(b["input_ids"], b["labels"]))
    assert abs(l_libai - l_plain) < 1e-5, f"initial losses differ: {l_libai} vs {l_plain}"

    runner = ModelRunner(libai_model)
    contenders = [
        Contender("libai", runner.train_step, adamw(libai_model, args.lr)),
        Contender("plain", plain_step(plain_model), adamw(plain_model, args.lr)),
    ]
    n_params = sum(p.numel() for p in plain_model.parameters())
    tokens = args.batch * args.seq
    print(
        f"GPT: layers={args.layers} hidden={args.hidden} heads={args.heads} ffn={args.ffn} "
        f"vocab={args.vocab} seq={args.seq} batch={args.batch} ({n_params / 1e6:.2f}M params, "
        f"{tokens} tokens/step)"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; initial loss libai {l_libai:.6f} "
        f"plain {l_plain:.6f} (|diff| {abs(l_libai - l_plain):.1e})"
    )
    print(
        f"{args.warmup} warmup steps, then {args.repeats} interleaved blocks x {args.steps} steps"
    )

    run_interleaved(contenders, batches, args.warmup, args.repeats, args.steps)

    libai, plain = contenders
    # Same function, same batches, same optimizer: the two trajectories stay together (a loss
    # spike at a large --lr would amplify rounding differences, hence only the first steps).
    diffs = [abs(a - b) for a, b in zip(libai.losses, plain.losses)]
    print(
        f"max |loss libai - loss plain|: first 10 steps {max(diffs[:10]):.1e}, "
        f"all {len(diffs)} steps {max(diffs):.1e}"
    )
    assert max(diffs[:10]) < 1e-4, "the two models diverged: not the same computation"
    wall, cpu = print_step_table(contenders, tokens)
    # The verdict: libai/plain within each pair of adjacent blocks (moments apart on the
    # machine), median over the pairs; robust to slow drift and to bursts alike.
    n = args.steps
    pairs = block_pair_ratios(libai, plain, n)
    ratio = statistics.median(pairs)
    print()
    print(
        f"ratio libai/plain step time: {ratio:.3f} (median of {len(pairs)} block pairs; "
        f"quartiles {pairs[len(pairs) // 4]:.3f}-{pairs[(3 * len(pairs)) // 4]:.3f}); "
        f"of median steps {wall['libai'] / wall['plain']:.3f}; "
        f"of CPU time {cpu['libai'] / cpu['plain']:.3f}"
    )
    verdict = "MET" if ratio <= TARGET_RATIO else "MISSED"
    print(f"target <= {TARGET_RATIO:.2f}x: {verdict}")
    if not math.isfinite(libai.losses[-1]):
        raise SystemExit("libai loss is not finite")
    return ratio


if __name__ == "__main__":
    cli_args = parse_args()
    try:
        ratio = main(cli_args)
    finally:
        dist.destroy_dist()
    sys.exit(1 if cli_args.strict and ratio > TARGET_RATIO else 0)
