"""libai's GPT-2 (``configs/gpt2_pretrain.py``) against Hugging Face ``GPT2LMHeadModel``.

Training throughput (tokens/s) on one process (tp = dp = pp = 1) on CPU. The target: libai is
not slower, i.e. tokens/s libai / HF >= 1.0.

The libai model is the config's own ``model`` (``LazyConfig.load(...)`` then ``instantiate``).
Its ``vocab_size`` is normally set from the tokenizer at train time; here it is ``--vocab``
(default 8192, the size of the sample tokenizer). The HF model is built from a ``GPT2Config``
of the same shapes (n_layer, n_embd, n_head, n_inner = ffn, n_positions, vocab,
``gelu_new`` as in GPT-2's own configs, or ``--act gelu_pytorch_tanh``, the same function as
one fused kernel like libai's; no dropout, the same layer-norm epsilon) with ``attn_implementation="sdpa"``
(``--attn eager`` for the other one) and ``use_cache=False``. libai's weights are copied into
it: HF's ``Conv1D`` weights are ``[in, out]`` (transposed), and libai's fused qkv rows are
grouped per head (``[q_h; k_h; v_h]``) while HF's ``c_attn`` columns are ``[Q | K | V]``. The
initial losses must agree to 1e-4, and the training losses over the first steps too.

Both models use the config's optimizer: AdamW with its lr, betas, eps and weight decay, and
libai's default parameter groups (no weight decay on norms and biases) built by
``libai.optim.build_optimizer`` for both; and the config's gradient clipping (global norm 1.0;
``--no-clip`` to leave it out of both). Same micro batch and sequence length as the config.

Both compute the same next-token loss on the same tokens: a batch is ``seq + 1`` tokens,
``input_ids = tokens[:, :-1]`` and ``labels = tokens[:, 1:]`` (libai expects already-shifted
labels). HF's own ``labels=`` would shift again internally (and score only ``seq - 1``
positions), so the HF loop takes the logits and calls ``F.cross_entropy`` on them, the usual
plain training loop.

A step is forward + backward + clipping + ``optimizer.step()`` + ``zero_grad(set_to_none=True)``
+ reading the loss as a float; libai's is ``ModelRunner(model).train_step(batch, optimizer,
max_grad_norm=...)``, the trainer's own call. The two are timed in interleaved blocks
(A B, B A, ...); the verdict is the median over pairs of adjacent blocks of HF's median step
time over libai's in that pair (= tokens/s libai / HF).

    python benchmarks/bench_gpt_vs_hf.py                   # the config's shape, ~1 min
    python benchmarks/bench_gpt_vs_hf.py --act gelu_pytorch_tanh   # HF's fastest equivalent
    python benchmarks/bench_gpt_vs_hf.py --batch 4 --seq 64 --threads 1
    python benchmarks/bench_gpt_vs_hf.py --strict          # exit 1 if the target is missed
"""

from __future__ import annotations

import argparse
import copy
import math
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import Contender, block_pair_ratios, print_step_table, run_interleaved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from libai import dist  # noqa: E402
from libai.config import LazyConfig, instantiate  # noqa: E402
from libai.optim import build_optimizer, get_clip_grad_settings  # noqa: E402
from libai.runtime.parallel import ModelRunner  # noqa: E402

TARGET_RATIO = 1.0  # tokens/s libai / HF
CONFIG = ROOT / "configs" / "gpt2_pretrain.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(CONFIG))
    p.add_argument("--vocab", type=int, default=8192, help="the sample tokenizer's size")
    p.add_argument("--batch", type=int, default=None, help="default: train_micro_batch_size")
    p.add_argument("--seq", type=int, default=None, help="default: model.cfg.max_seq_length")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="HF attention")
    p.add_argument(
        "--act",
        default="gelu_new",
        choices=["gelu_new", "gelu_pytorch_tanh"],
        help="HF activation: gelu_new (GPT-2's, a Python formula) or gelu_pytorch_tanh "
        "(the same function as one F.gelu(approximate='tanh') kernel, as libai's)",
    )
    p.add_argument("--no-clip", action="store_true", help="no gradient clipping in either")
    p.add_argument("--steps", type=int, default=5, help="timed steps per block")
    p.add_argument("--repeats", type=int, default=12, help="timed blocks per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--strict", action="store_true", help="exit 1 if the target is missed")
    return p.parse_args(argv)


def build_hf(mcfg, vocab: int, attn: str, act: str) -> GPT2LMHeadModel:
    """A ``GPT2LMHeadModel`` with the shapes of libai's ``model.cfg``."""
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=mcfg.max_seq_length,
        n_embd=mcfg.hidden_size,
        n_layer=mcfg.hidden_layers,
        n_head=mcfg.num_attention_heads,
        n_inner=mcfg.ffn_hidden_size,
        activation_function=act,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=mcfg.layernorm_epsilon,
        initializer_range=mcfg.initializer_range,
        tie_word_embeddings=True,
        use_cache=False,
        bos_token_id=None,  # GPT-2's 50256 is outside a smaller vocab
        eos_token_id=None,
        attn_implementation=attn,
    )
    model = GPT2LMHeadModel(config)
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    return model


@torch.no_grad()
def copy_libai_weights(libai_model, hf: GPT2LMHeadModel, heads: int) -> None:
    """Load libai's (tp = 1, plain-tensor) parameters into the HF model."""
    gpt, tr = libai_model.GPT_model, hf.transformer

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        assert dst.shape == src.shape, (dst.shape, src.shape)
        dst.copy_(src)

    def qkv_rows(t: torch.Tensor) -> torch.Tensor:
        # libai groups the fused rows per head: [q_h; k_h; v_h] for h = 0..heads-1;
        # HF's c_attn output is [Q_all | K_all | V_all]
        return t.view(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    put(tr.wte.weight, gpt.embeddings.token_embeddings.weight)
    put(tr.wpe.weight, gpt.embeddings.position_embeddings.weight)
    for block, layer in zip(tr.h, gpt.transformer.layers.values()):
        attn, mlp = layer.self_attention, layer.mlp
        put(block.ln_1.weight, layer.input_layernorm.weight)
        put(block.ln_1.bias, layer.input_layernorm.bias)
        # HF Conv1D: y = x @ W + b with W [in, out]; libai Linear: W [out, in]
        put(block.attn.c_attn.weight, qkv_rows(attn.query_key_value.weight).t())
        put(block.attn.c_attn.bias, qkv_rows(attn.query_key_value.bias))
        put(block.attn.c_proj.weight, attn.dense.weight.t())
        put(block.attn.c_proj.bias, attn.dense.bias)
        put(block.ln_2.weight, layer.post_cross_attention_layernorm.weight)
        put(block.ln_2.bias, layer.post_cross_attention_layernorm.bias)
        put(block.mlp.c_fc.weight, mlp.dense_h_to_4h.weight.t())
        put(block.mlp.c_fc.bias, mlp.dense_h_to_4h.bias)
        put(block.mlp.c_proj.weight, mlp.dense_4h_to_h.weight.t())
        put(block.mlp.c_proj.bias, mlp.dense_4h_to_h.bias)
    put(tr.ln_f.weight, gpt.transformer.layernorm_f.weight)
    put(tr.ln_f.bias, gpt.transformer.layernorm_f.bias)
    assert hf.lm_head.weight is tr.wte.weight, "HF head is not tied to the embedding"
    n_libai = sum(p.numel() for p in libai_model.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_libai == n_hf, (n_libai, n_hf)


def make_batches(vocab, batch, seq, seed, n: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed + 1)
    batches = []
    for _ in range(n):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        batches.append(
            {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
        )
    return batches


def hf_loss(model: GPT2LMHeadModel, batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"]).logits
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), batch["labels"].view(-1))


def hf_step(model, clip):
    params = [p for p in model.parameters() if p.requires_grad]

    def step(batch, optimizer):
        loss = hf_loss(model, batch)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip[0], clip[1])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def libai_step(runner, clip):
    max_norm, norm_type = clip if clip is not None else (None, 2.0)

    def step(batch, optimizer):
        return runner.train_step(batch, optimizer, max_grad_norm=max_norm, norm_type=norm_type)

    return step


def main(args: argparse.Namespace) -> float:
    """Build, check and time both models; print the figures; return tokens/s libai / HF."""
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = LazyConfig.load(args.config)
    mcfg = cfg.model.cfg
    mcfg.vocab_size = args.vocab
    batch_size = args.batch or cfg.train.train_micro_batch_size
    seq = args.seq or mcfg.max_seq_length
    assert seq <= mcfg.max_seq_length, f"--seq {seq} > max_seq_length {mcfg.max_seq_length}"
    for key in ("embedding_dropout_prob", "attention_dropout_prob", "output_dropout_prob"):
        assert mcfg[key] == 0.0, f"{key}={mcfg[key]}: dropout must be off to compare"
    dist.setup_dist_util({})  # one process: tp = dp = pp = 1

    torch.manual_seed(args.seed)
    libai_model = instantiate(cfg.model)
    hf_model = build_hf(mcfg, args.vocab, args.attn, args.act)
    copy_libai_weights(libai_model, hf_model, mcfg.num_attention_heads)
    libai_model.train()
    hf_model.train()

    batches = make_batches(args.vocab, batch_size, seq, args.seed)
    with torch.no_grad():
        b = batches[0]
        l_libai = float(libai_model(**b)["lm_loss"])
        l_hf = float(hf_loss(hf_model, b))
    assert abs(l_libai - l_hf) < 1e-4, f"initial losses differ: {l_libai} vs {l_hf}"

    # The config's optimizer (AdamW, lr/betas/eps/wd, libai's default groups) for both.
    opt_libai = build_optimizer(cfg.optim, libai_model)
    opt_hf = build_optimizer(copy.deepcopy(cfg.optim), hf_model)
    assert len(opt_libai.param_groups) == len(opt_hf.param_groups)
    for ga, gb in zip(opt_libai.param_groups, opt_hf.param_groups):
        assert sum(p.numel() for p in ga["params"]) == sum(p.numel() for p in gb["params"])
        assert {k: v for k, v in ga.items() if k != "params"} == {
            k: v for k, v in gb.items() if k != "params"
        }
    clip = None if args.no_clip else get_clip_grad_settings(opt_libai)
    runner = ModelRunner(libai_model)
    contenders = [
        Contender("libai", libai_step(runner, clip), opt_libai),
        Contender("HF", hf_step(hf_model, clip), opt_hf),
    ]
    n_params = sum(p.numel() for p in hf_model.parameters())
    tokens = batch_size * seq
    g0 = opt_libai.param_groups[0]
    print(
        f"{Path(args.config).name}: layers={mcfg.hidden_layers} hidden={mcfg.hidden_size} "
        f"heads={mcfg.num_attention_heads} ffn={mcfg.ffn_hidden_size} vocab={args.vocab} "
        f"seq={seq} batch={batch_size} ({n_params / 1e6:.2f}M params, {tokens} tokens/step)"
    )
    print(
        f"AdamW lr={g0['lr']} betas={g0['betas']} eps={g0['eps']} wd={cfg.optim.weight_decay} "
        f"({len(opt_libai.param_groups)} groups), clip={clip}; HF attention "
        f"{hf_model.config._attn_implementation!r}, activation {args.act!r}"
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; "
        f"initial loss libai {l_libai:.6f} HF {l_hf:.6f} (|diff| {abs(l_libai - l_hf):.1e})"
    )
    print(
        f"{args.warmup} warmup steps, then {args.repeats} interleaved blocks x {args.steps} steps"
    )

    run_interleaved(contenders, batches, args.warmup, args.repeats, args.steps)

    libai, hf = contenders
    # Same function, same batches, same optimizer: the trajectories stay together at first
    # (later, rounding differences grow at the config's lr of 2e-3).
    diffs = [abs(a - b) for a, b in zip(libai.losses, hf.losses)]
    print(
        f"max |loss libai - loss HF|: first 10 steps {max(diffs[:10]):.1e}, "
        f"first 30 {max(diffs[:30]):.1e}, all {len(diffs)} steps {max(diffs):.1e} (last loss libai {libai.losses[-1]:.4f} "
        f"HF {hf.losses[-1]:.4f})"
    )
    assert max(diffs[:10]) < 1e-3, "the two models diverged: not the same computation"
    wall, cpu = print_step_table(contenders, tokens)
    # tokens/s libai / HF within each pair of adjacent blocks, median over the pairs.
    n = args.steps
    pairs = block_pair_ratios(hf, libai, n)
    ratio = statistics.median(pairs)
    print()
    print(
        f"ratio tokens/s libai/HF: {ratio:.3f} (median of {len(pairs)} block pairs; "
        f"quartiles {pairs[len(pairs) // 4]:.3f}-{pairs[(3 * len(pairs)) // 4]:.3f}); "
        f"of median steps {wall['HF'] / wall['libai']:.3f}; "
        f"of CPU time {cpu['HF'] / cpu['libai']:.3f}"
    )
    verdict = "MET" if ratio >= TARGET_RATIO else "MISSED"
    print(f"target >= {TARGET_RATIO:.2f}: {verdict}")
    if not math.isfinite(libai.losses[-1]):
        raise SystemExit("libai loss is not finite")
    return ratio


if __name__ == "__main__":
    cli_args = parse_args()
    try:
        ratio = main(cli_args)
    finally:
        dist.destroy_dist()
    sys.exit(1 if cli_args.strict and ratio < TARGET_RATIO else 0)
