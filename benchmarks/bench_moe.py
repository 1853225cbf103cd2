"""libai's Mixture-of-Experts layer against transformers' ``MixtralSparseMoeBlock`` on the
same weights and tokens: forward + backward time, grouped and looped experts.

Contenders (one process, same input ``[batch, seq, hidden]``, same upstream gradient):

- ``hf``: transformers' Mixtral sparse block (its default experts implementation: a loop over
  the experts that were hit);
- ``libai-grouped``: :class:`libai.layers.MoE`, experts run by ``torch._grouped_mm``;
- ``libai-looped``: the same layer, one matmul per expert;
- ``experts-only`` (a reference, not a contender): libai's grouped experts alone, forward +
  backward, on the routed rows sorted beforehand: the expert math every contender runs, with
  routing, dispatch and combine free. ``hf / experts-only`` is the ceiling of any MoE layer
  whose experts run these matmuls: what is left to win lies outside them.

Their outputs must agree (fp32, 1e-5) before timing. Timing: interleaved blocks (A B C,
C B A, ...; benchmarks/harness.py); the verdict is the median over adjacent block pairs of
HF's median step time over ours (= speed libai / HF). Goal (issue 40): >= 1.5x on CPU.

    python benchmarks/bench_moe.py                     # tokens 2048, hidden 512, ffn 1024, 8 experts
    python benchmarks/bench_moe.py --tiny              # seconds, a smoke test
    python benchmarks/bench_moe.py --device cuda --dtype bf16 --batch 8 --seq 2048 \\
        --hidden 2048 --ffn 5632 --experts 8
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch
from harness import Contender, block_pair_ratios, print_step_table, run_interleaved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_RATIO = 1.5


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="small shapes, few steps")
    args = p.parse_args(argv)
    if args.tiny:
        args.batch, args.seq, args.hidden, args.ffn = 2, 64, 64, 128
        args.warmup, args.repeats, args.steps = 1, 2, 2
    return args


def build(args):
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from libai import dist
    from libai.layers import MoE, MoEConfig

    dist.setup_dist_util({"device_type": args.device})
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    config = transformers.MixtralConfig(
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
    )
    torch.manual_seed(0)
    hf = MixtralSparseMoeBlock(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(std=0.02)
    ours = {}
    for impl in ("grouped", "looped"):
        moe = MoE(
            args.hidden,
            args.ffn,
            MoEConfig(num_experts=args.experts, top_k=args.top_k, expert_impl=impl),
        )
        with torch.no_grad():
            moe.router.weight.copy_(hf.gate.weight)
            moe.experts.w_gate.copy_(hf.experts.gate_up_proj[:, : args.ffn])
            moe.experts.w_up.copy_(hf.experts.gate_up_proj[:, args.ffn :])
            moe.experts.w_down.copy_(hf.experts.down_proj)
        ours[impl] = moe.to(args.device, dtype)
    return hf.to(args.device, dtype), ours, dtype


def backward_step(forward, module, inp, grad, device):
    """A timed step: ``forward(inp)`` with ``inp`` a fresh leaf, backward of ``grad``, the
    gradients dropped (``batch`` of the harness ignored: ``inp`` is the step's input)."""

    def step(batch, optimizer):
        out = forward(inp.detach().requires_grad_())
        out.backward(grad)
        module.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return float(out.detach().float().square().mean())

    return step


def experts_only_step(moe, x, args):
    """A step of ``moe``'s experts alone: forward + backward on ``x``'s routed rows, sorted
    by expert once here (the routing, dispatch and combine of a real step left out)."""
    from libai.layers.moe_dispatch import Permutation

    flat = x.reshape(-1, x.shape[-1])
    with torch.no_grad():
        perm = Permutation(moe.router(flat).experts, args.experts, None)
        rows = flat.index_select(0, perm.tokens)
    grad = torch.randn(rows.shape, generator=torch.Generator().manual_seed(2)).to(rows)
    return backward_step(lambda inp: moe.experts(inp, perm.counts), moe, rows, grad, args.device)


def main(args: argparse.Namespace) -> float:
    hf, ours, dtype = build(args)
    g = torch.Generator().manual_seed(1)
    shape = (args.batch, args.seq, args.hidden)
    x = torch.randn(shape, generator=g).to(args.device, dtype)
    grad = torch.randn(shape, generator=g).to(args.device, dtype)
    with torch.no_grad():
        want = hf(x.clone())
        for impl, moe in ours.items():
            diff = (moe(x) - want).abs().max().item()
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            if diff > tol:
                raise SystemExit(f"libai-{impl} differs from transformers by {diff:.3g}")

    def step_of(module):
        return backward_step(module, module, x, grad, args.device)

    contenders = [Contender("hf", step_of(hf), None)]
    contenders += [Contender(f"libai-{impl}", step_of(m), None) for impl, m in ours.items()]
    contenders.append(Contender("experts-only", experts_only_step(ours["grouped"], x, args), None))
    run_interleaved(contenders, [x], args.warmup, args.repeats, args.steps)
    tokens = args.batch * args.seq
    print(
        f"\nMoE block forward + backward, {args.device} {args.dtype}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
        f"tokens {tokens}, hidden {args.hidden}, ffn {args.ffn}, experts {args.experts}, "
        f"top-{args.top_k}"
    )
    print_step_table(contenders, tokens)
    hf_c, grouped, looped, experts = contenders
    ratios = {}
    for c in (grouped, looped):
        pairs = block_pair_ratios(hf_c, c, args.steps)
        ratios[c.name] = statistics.median(pairs)
        print(f"speed {c.name} / hf: {ratios[c.name]:.2f}x (median of {len(pairs)} block pairs)")
    ceiling = statistics.median(block_pair_ratios(hf_c, experts, args.steps))
    print(f"ceiling hf / experts-only (routing, dispatch and combine free): {ceiling:.2f}x")
    best = max(ratios.values())
    print(f"goal >= {TARGET_RATIO:.1f}x: {'MET' if best >= TARGET_RATIO else 'MISSED'}")
    return best


if __name__ == "__main__":
    main(parse_args())
