"""End-to-end tests of libai.align: the real recorder, dumps, checkers and auto_diff on tiny
CPU models with planted faults (each must be found at its module and phase)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libai.align import (
    auto_diff,
    check_grads,
    check_params,
    check_report,
    check_weights,
    create_model,
)
from libai.align.tree_log import CHILDREN_EQUAL, ENCLOSING_AGREE, HERE, LEAF

VOCAB, DIM, SEQ = 11, 8, 5

# -------------------------------------------------------------------------- tiny models


class BadGeluGrad(torch.autograd.Function):
    """Exact GELU forward, a wrong backward (the derivative is missing a factor 2)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(F.gelu(x), x, grad)
        return 2 * dx


class Act(nn.Module):
    """GELU; ``kind`` "tanh" uses the tanh approximation, "badgrad" a wrong backward."""

    def __init__(self, kind: str = "exact"):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "tanh":
            return F.gelu(x, approximate="tanh")
        if self.kind == "badgrad":
            return BadGeluGrad.apply(x)
        return F.gelu(x)


class Attention(nn.Module):
    """Single-head self-attention without the output projection (the block holds it)."""

    def __init__(self, d: int, scale_mult: float = 1.0):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.scale = scale_mult / math.sqrt(d)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) * self.scale
        return scores.softmax(-1) @ self.v(x)


class FusedAttention(Attention):
    """The same math with one fused q/k/v matmul: the q/k/v modules are never called."""

    def forward(self, x):
        w = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        b = torch.cat([self.q.bias, self.k.bias, self.v.bias])
        q, k, v = F.linear(x, w, b).chunk(3, dim=-1)
        return (q @ k.transpose(-1, -2) * self.scale).softmax(-1) @ v


class Mlp(nn.Module):
    def __init__(self, d: int, act: str = "exact"):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, 2 * d), Act(act), nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN block; ``fault`` plants one error (see :class:`Net`)."""

    def __init__(self, d: int, fault: str | None = None, attn_cls=Attention):
        super().__init__()
        self.fault = fault
        self.ln1 = nn.LayerNorm(d)
        scale = 0.5 if fault == "scale" else 1.0
        self.attn = attn_cls(d, scale)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        act = fault if fault in ("tanh", "badgrad") else "exact"
        self.mlp = Mlp(d, act)

    def forward(self, x):
        if self.fault == "swap":  # mlp before attention
            x = x + self.mlp(self.ln2(x))
            return x + self.proj(self.attn(self.ln1(x)))
        x = x + self.proj(self.attn(self.ln1(x)))
        if self.fault == "residual":  # the residual added twice
            return x + x + self.mlp(self.ln2(x))
        return x + self.mlp(self.ln2(x))


class Net(nn.Module):
    """Embedding -> blocks -> head. ``fault`` is planted in block ``fault_block``:
    "swap" (mlp before attention), "scale" (wrong attention scale), "residual" (residual
    added twice), "tanh" (tanh-approximate GELU), "badgrad" (GELU with a wrong backward)."""

    def __init__(self, fault=None, fault_block=1, n_blocks=2, attn_cls=Attention):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(
            Block(DIM, fault if i == fault_block else None, attn_cls) for i in range(n_blocks)
        )
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make(seed=0, **kw) -> Net:
    torch.manual_seed(seed)
    net = Net(**kw)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for m in net.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return net


def ids_input(seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    return {"ids": ids}, {"ids": ids}


# ------------------------------------------------------------------------------ helpers


def log_text(root, name) -> str:
    with open(os.path.join(root, "align_log", name), encoding="utf-8") as f:
        return f.read()


def here(root, phase="forward", step=0) -> str | None:
    """The HERE line of a report log, or None when nothing differs."""
    lines = [
        line
        for line in log_text(root, f"report_{phase}_step_{step}_rank_0.log").splitlines()
        if HERE in line
    ]
    assert len(lines) <= 1
    return lines[0].strip() if lines else None


def found_key(line: str) -> str:
    """The key of a tree-log line (``<key> (call c)  A: ...``)."""
    return line.split(" (call ")[0]


def diff_count(root, phase="forward", step=0) -> int:
    text = log_text(root, f"report_{phase}_step_{step}_rank_0.log")
    return sum("[DIFF" in line for line in text.splitlines())


def report_routes(path) -> list[str]:
    with open(os.path.join(path, "report.json"), encoding="utf-8") as f:
        return [n["route"] for n in json.load(f)["nodes"]]


def SQ_LOSS(out):
    return out.float().pow(2).mean()


def run_diff(tmp_path, raw_kw, name="run", **kw):
    """auto_diff of ``make()`` against ``make(**raw_kw)``; returns (result, dump root)."""
    root = str(tmp_path / name)
    kw.setdefault("loss_fns", (SQ_LOSS, SQ_LOSS))
    ok = auto_diff(make(), make(**raw_kw), ids_input(), dump_root=root, **kw)
    return ok, root


def rank_dir(root, model, step=0):
    return os.path.join(root, model, f"step_{step}", "rank_0")


def hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ------------------------------------------------------------------------ 1. identical


def test_identical_models_pass(tmp_path, capsys):
    ok, root = run_diff(tmp_path, {})
    assert ok is True
    assert here(root) is None and here(root, "backward") is None
    out = capsys.readouterr().out
    assert "auto_diff: PASS" in out and "DIFF" not in out
    routes = report_routes(rank_dir(root, "raw"))
    assert routes[:3] == ["", "emb", "blocks.0"]  # the ModuleList is never called
    assert "blocks.1.attn.q" in routes and "blocks.1.mlp.act" in routes


# --------------------------------------------------------------------- 2. planted faults


def test_swapped_sublayers_found_at_first_affected_module(tmp_path, capsys):
    ok, root = run_diff(tmp_path, {"fault": "swap"}, diff_phase="forward")
    assert ok is False
    line = here(root)
    # base calls ln1 first; raw feeds ln1 the output of the mlp residual
    assert found_key(line) == "blocks.1.ln1" and LEAF in line
    text = log_text(root, "report_forward_step_0_rank_0.log")
    assert "blocks.0 (call 0)  A: blocks.0 Block  |  B: blocks.0 Block   [ok]" in text
    assert "forward: DIFF at key 'blocks.1.ln1' (call 0): leaf differs" in capsys.readouterr().out


def test_wrong_attention_scale_found_at_attention(tmp_path, capsys):
    ok, root = run_diff(tmp_path, {"fault": "scale"})
    assert ok is False
    line = here(root)
    assert found_key(line) == "blocks.1.attn" and CHILDREN_EQUAL in line
    out = capsys.readouterr().out
    assert f"forward: DIFF at key 'blocks.1.attn' (call 0): {CHILDREN_EQUAL}" in out
    # the fault in block 1 leaves block 0 alone in the forward pass
    text = log_text(root, "report_forward_step_0_rank_0.log")
    assert "blocks.0 (call 0)  A: blocks.0 Block  |  B: blocks.0 Block   [ok]" in text


def test_wrong_residual_found_at_block(tmp_path, capsys):
    ok, root = run_diff(tmp_path, {"fault": "residual"}, diff_phase="forward")
    assert ok is False
    line = here(root)
    assert found_key(line) == "blocks.1" and CHILDREN_EQUAL in line
    assert f"DIFF at key 'blocks.1' (call 0): {CHILDREN_EQUAL}" in capsys.readouterr().out


def test_wrong_custom_backward_found_in_backward_only(tmp_path, capsys):
    ok, root = run_diff(tmp_path, {"fault": "badgrad"})
    assert ok is False
    assert here(root, "forward") is None
    line = here(root, "backward")
    assert found_key(line) == "blocks.1.mlp.act" and LEAF in line
    out = capsys.readouterr().out
    assert "backward: DIFF at key 'blocks.1.mlp.act' (call 0): leaf differs" in out
    base, raw = (os.path.join(root, m) for m in ("base", "raw"))
    assert check_report(base, raw, {"diff_phase": "forward"}) is True
    assert check_report(base, raw, {"diff_phase": "backward"}) is False
    assert found_key(here(root, "backward")) == "blocks.1.mlp.act"
    # the parameters after the activation get the right gradients, those before it not
    assert check_grads(base, raw) is False
    grads = log_text(root, "grads_step_0_rank_0.log")
    (first,) = [line for line in grads.splitlines() if HERE in line]
    assert first.startswith("emb.weight ")
    assert "blocks.1.mlp.fc2.weight  A: blocks.1.mlp.fc2.weight" in grads
    fc2 = next(line for line in grads.splitlines() if line.startswith("blocks.1.mlp.fc2.weight"))
    fc1 = next(line for line in grads.splitlines() if line.startswith("blocks.1.mlp.fc1.weight"))
    assert "[ok]" in fc2 and "[DIFF" in fc1


def _sgd_pair(lr_b):
    base, raw = make(), make()
    opts = (torch.optim.SGD(base.parameters(), lr=0.1), torch.optim.SGD(raw.parameters(), lr=lr_b))
    return base, raw, opts


def test_wrong_optimizer_lr_found_in_weights(tmp_path, capsys):
    root = str(tmp_path / "opt")
    base, raw, opts = _sgd_pair(0.2)
    loss = (lambda o: o.pow(2).mean(),) * 2
    assert auto_diff(base, raw, ids_input(), loss, opts, dump_root=root) is False
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    assert check_report(a, b) is True
    assert check_grads(a, b) is True
    capsys.readouterr()
    assert check_weights(a, b) is False
    out = capsys.readouterr().out
    assert "weights: DIFF in" in out and "first key 'emb.weight'" in out

    # two steps: the second step runs on different weights, so its report differs too
    root2 = str(tmp_path / "opt2")
    base, raw, opts = _sgd_pair(0.2)
    assert auto_diff(base, raw, ids_input(), loss, opts, steps=2, dump_root=root2) is False
    a, b = os.path.join(root2, "base"), os.path.join(root2, "raw")
    assert check_report(os.path.join(a, "step_0"), os.path.join(b, "step_0")) is True
    assert check_report(os.path.join(a, "step_1"), os.path.join(b, "step_1")) is False
    assert found_key(here(root2, step=1)) == "emb"  # the embedding table moved first

    # the same lr everywhere passes, also over two steps
    root3 = str(tmp_path / "opt3")
    base, raw, opts = _sgd_pair(0.1)
    assert auto_diff(base, raw, ids_input(), loss, opts, steps=2, dump_root=root3) is True


def test_bfloat16_raw_passes_with_loose_tolerance_only(tmp_path):
    """A bf16 copy of the model against fp32: the largest forward difference of this tiny
    model is ~1.8e-2 absolute (it fails at atol=rtol=5e-3 and passes at 1e-2), the
    gradients are small enough for atol to cover them. atol=rtol=2e-2 passes both phases
    and the parameter gradients; the strict default finds the first rounded module."""
    inputs = ids_input()
    kw = dict(loss_fns=(SQ_LOSS, SQ_LOSS), diff_phase="both")
    strict_root = str(tmp_path / "strict")
    assert (
        auto_diff(make(), make().to(torch.bfloat16), inputs, dump_root=strict_root, **kw) is False
    )
    assert found_key(here(strict_root)) == "emb"  # bf16 rounding of the embedding table
    loose_root = str(tmp_path / "loose")
    raw = make().to(torch.bfloat16)
    ok = auto_diff(make(), raw, inputs, atol=2e-2, rtol=2e-2, dump_root=loose_root, **kw)
    assert ok is True
    # the dumps keep each side's dtype; comparisons run in float64
    with open(os.path.join(rank_dir(loose_root, "raw"), "report.json")) as f:
        node = json.load(f)["nodes"][0]
    assert node["outputs"][0]["dtype"] == "bfloat16"
    assert raw.head.weight.dtype == torch.bfloat16  # auto_init kept the raw dtype


# ---------------------------------------------------- 3. black / white lists, layer maps


def test_black_list_all_moves_search_to_parent(tmp_path, capsys):
    # tanh-approximate GELU in block 1: found at the activation without lists
    ok, root = run_diff(tmp_path, {"fault": "tanh"}, "plain", diff_phase="forward")
    assert ok is False
    assert found_key(here(root)) == "blocks.1.mlp.act"

    def recorders(mode):
        recs = create_model(make(), "base"), create_model(make(fault="tanh"), "raw")
        for rec in recs:
            rec.update_black_list(Mlp, mode)
        return recs

    expected = {
        "all": ("blocks.1", CHILDREN_EQUAL),
        "self": ("blocks.1.mlp.act", LEAF),
        "sublayers": ("blocks.1.mlp", LEAF),
    }
    for mode, (key, reason) in expected.items():
        root = str(tmp_path / mode)
        base, raw = recorders(mode)
        assert auto_diff(base, raw, ids_input(), dump_root=root, diff_phase="forward") is False
        line = here(root)
        assert found_key(line) == key and reason in line, (mode, line)
        routes = report_routes(rank_dir(root, "raw"))
        has_mlp = "blocks.1.mlp" in routes
        has_inside = "blocks.1.mlp.fc1" in routes
        assert (has_mlp, has_inside) == {
            "all": (False, False),
            "self": (False, True),
            "sublayers": (True, False),
        }[mode]
        assert "blocks.1.ln2" in routes
        # user recorders stay open: hooks are still installed
        assert hooks_left(base.model) > 0
        base.close(), raw.close()
        assert hooks_left(base.model) == 0


def test_white_list_self_records_only_those(tmp_path):
    base, raw = create_model(make(), "base"), create_model(make(fault="scale"), "raw")
    for rec in (base, raw):
        rec.update_white_list(Attention, "self")
    root = str(tmp_path / "white")
    assert auto_diff(base, raw, ids_input(), dump_root=root) is False
    assert report_routes(rank_dir(root, "base")) == ["blocks.0.attn", "blocks.1.attn"]
    line = here(root)
    assert found_key(line) == "blocks.1.attn" and LEAF in line  # no children recorded
    base.close(), raw.close()

    # white wins over black; "all" also records the q/k/v projections
    rec = create_model(make(), "wb")
    rec.update_black_list(Attention, "all")
    rec.update_white_list(rec.model.blocks[0].attn, "all")
    rec(**ids_input()[0])
    rec.dump_report(str(tmp_path / "wb"))
    assert report_routes(rank_dir(str(tmp_path / "wb"), "wb")) == [
        "blocks.0.attn",
        "blocks.0.attn.q",
        "blocks.0.attn.k",
        "blocks.0.attn.v",
    ]
    rec.close()


def test_layer_map_compares_fused_attention_at_its_boundary(tmp_path, capsys):
    inputs = ids_input()
    # unmapped: base records attn.q/k/v, the fused raw attention never calls them
    with pytest.raises(ValueError, match=r"key 'blocks\.0\.attn\.q'"):
        auto_diff(make(), make(attn_cls=FusedAttention), inputs, dump_root=str(tmp_path / "u"))

    base = create_model(make(), "base")
    raw = create_model(make(attn_cls=FusedAttention), "raw")
    base.set_layer_map([Attention])
    raw.set_layer_map([FusedAttention])
    root = str(tmp_path / "mapped")
    # fused vs separate matmuls may round differently: within the default tolerance
    assert auto_diff(base, raw, inputs, dump_root=root) is True
    routes = report_routes(rank_dir(root, "raw"))
    assert "blocks.0.attn" in routes and "blocks.0.attn.q" not in routes
    with open(os.path.join(rank_dir(root, "raw"), "report.json")) as f:
        mapped = [n["route"] for n in json.load(f)["nodes"] if n["mapped"]]
    assert mapped == ["blocks.0.attn", "blocks.1.attn"]
    base.close(), raw.close()

    # a fault inside a mapped module is found at the mapped module
    base = create_model(make(), "base")
    raw = create_model(make(fault="scale", attn_cls=FusedAttention), "raw")
    base.set_layer_map([Attention])
    raw.set_layer_map([FusedAttention])
    root = str(tmp_path / "mapped_fault")
    assert auto_diff(base, raw, inputs, dump_root=root) is False
    line = here(root)
    assert found_key(line) == "blocks.1.attn" and LEAF in line
    base.close(), raw.close()


class RenamedBlock(Block):
    """The attention under another attribute name (``self_attn``), fused."""

    def __init__(self, d):
        super().__init__(d, None, FusedAttention)
        self.self_attn = self.attn
        del self.attn

    def forward(self, x):
        x = x + self.proj(self.self_attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


def test_layer_map_pairs_differently_named_modules_in_call_order(tmp_path):
    base_model = make()
    raw_model = make()
    raw_model.blocks = nn.ModuleList(RenamedBlock(DIM) for _ in range(2))
    state = {k.replace(".attn.", ".self_attn."): v for k, v in base_model.state_dict().items()}
    raw_model.load_state_dict(state)
    inputs = ids_input()
    kw = dict(auto_init=False, diff_phase="forward")

    with pytest.raises(ValueError, match=r"key 'blocks\.0\.attn'"):
        auto_diff(base_model, raw_model, inputs, dump_root=str(tmp_path / "u"), **kw)

    base, raw = create_model(base_model, "base"), create_model(raw_model, "raw")
    base.set_layer_map([Attention])
    raw.set_layer_map([FusedAttention])
    root = str(tmp_path / "mapped")
    assert auto_diff(base, raw, inputs, dump_root=root, **kw) is True
    text = log_text(root, "report_forward_step_0_rank_0.log")
    assert "blocks.0.attn <-> blocks.0.self_attn (call 0) [matched by mapped]" in text
    assert "blocks.1.attn <-> blocks.1.self_attn (call 0) [matched by mapped]" in text
    base.close(), raw.close()


# ---------------------------------------------------------------------- 4. GPT-2 vs libai


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("align_gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=50,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(root)
    return str(root)


def _gpt2_pair(path):
    import transformers

    from libai.models.utils import load_huggingface

    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    lb = load_huggingface(path).eval()
    return hf, lb


GPT2_LOSS = (lambda o: o.logits.float().pow(2).mean(), lambda o: o["logits"].pow(2).mean())


def _gpt2_inputs():
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids}, {"input_ids": ids}


def test_gpt2_transformers_vs_libai_passes(gpt2_dir, tmp_path, capsys):
    hf, lb = _gpt2_pair(gpt2_dir)
    root = str(tmp_path / "gpt2")
    assert auto_diff(hf, lb, _gpt2_inputs(), GPT2_LOSS, dump_root=root) is True
    text = log_text(root, "report_forward_step_0_rank_0.log")
    assert "transformer.h.1.mlp.c_proj (call 0)" in text  # libai modules keyed by HF names
    assert "auto_diff: PASS" in capsys.readouterr().out
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    assert check_weights(a, b) is True  # exported in the transformers layout, key by key


def test_gpt2_perturbed_weight_found_at_its_layer(gpt2_dir, tmp_path, capsys):
    hf, lb = _gpt2_pair(gpt2_dir)
    with torch.no_grad():
        lb.GPT_model.transformer.layers["1"].mlp.dense_4h_to_h.weight[0, 0] += 0.1
    root = str(tmp_path / "gpt2_bad")
    ok = auto_diff(hf, lb, _gpt2_inputs(), GPT2_LOSS, auto_init=False, dump_root=root)
    assert ok is False
    line = here(root)
    assert found_key(line) == "transformer.h.1.mlp.c_proj" and LEAF in line
    assert "DIFF at key 'transformer.h.1.mlp.c_proj' (call 0)" in capsys.readouterr().out
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    assert check_weights(a, b) is False
    out = capsys.readouterr().out
    assert "weights: DIFF in 1 of" in out
    assert "first key 'transformer.h.1.mlp.c_proj.weight'" in out
    text = log_text(root, "weights_step_0_rank_0.log")
    (marked,) = [line for line in text.splitlines() if HERE in line]
    assert marked.startswith("transformer.h.1.mlp.c_proj.weight ")

    # auto_init copies the transformers weights back in: everything agrees again
    root = str(tmp_path / "gpt2_init")
    assert auto_diff(hf, lb, _gpt2_inputs(), GPT2_LOSS, dump_root=root) is True


# ----------------------------------------------------------------------- 5. single_step


def test_single_step_keeps_an_error_at_its_module(tmp_path):
    raw_kw = {"fault": "tanh", "fault_block": 0}
    for phase in ("forward", "both"):  # forward only: no backward, single_step still works
        ok, spread = run_diff(tmp_path, raw_kw, f"spread_{phase}", diff_phase=phase)
        assert ok is False
        ok, single = run_diff(
            tmp_path, raw_kw, f"single_{phase}", diff_phase=phase, single_step=True
        )
        assert ok is False
        line = here(spread)
        assert found_key(line) == "blocks.0.mlp.act" and LEAF in line
        # with base inputs fed in, the enclosing modules (mlp, block 0, root) agree
        line = here(single)
        assert found_key(line) == "blocks.0.mlp.act" and ENCLOSING_AGREE in line
        many, few = diff_count(spread), diff_count(single)
        assert many > 10 and few == 1, (phase, many, few)

    # the backward phase too: the wrong gradient stays at its module
    raw_kw = {"fault": "badgrad", "fault_block": 0}
    ok, spread = run_diff(tmp_path, raw_kw, "bspread")
    ok2, single = run_diff(tmp_path, raw_kw, "bsingle", single_step=True)
    assert ok is False and ok2 is False
    for root in (spread, single):
        assert here(root) is None
        assert found_key(here(root, "backward")) == "blocks.0.mlp.act"
    assert diff_count(single, "backward") < diff_count(spread, "backward")


# ------------------------------------------------------------------ 6. PaDiff regressions


def _two_step_dumps(tmp_path, perturb_step):
    root = str(tmp_path / "steps")
    base, raw = create_model(make(), "base"), create_model(make(), "raw")
    for step in range(2):
        if step == perturb_step:
            with torch.no_grad():
                raw.model.head.bias[0] += 1e-3
        for rec in (base, raw):
            rec.backward(rec(**ids_input()[0]).pow(2).mean())
            assert rec.try_dump(root) is True
            rec.model.zero_grad(set_to_none=True)
    base.close(), raw.close()
    return root, os.path.join(root, "base"), os.path.join(root, "raw")


def test_every_step_is_checked(tmp_path, capsys):
    root, a, b = _two_step_dumps(tmp_path, perturb_step=1)
    assert sorted(os.listdir(a)) == ["step_0", "step_1"]
    assert check_report(a, b) is False
    out = capsys.readouterr().out
    assert "report step 0 rank 0: ok" in out and "report step 1 rank 0: DIFF" in out
    assert here(root, step=0) is None
    line = here(root, step=1)
    assert found_key(line) == "head" and LEAF in line
    assert check_report(os.path.join(a, "step_0"), os.path.join(b, "step_0")) is True
    assert check_params(a, b) is False  # the bias value and its gradient at step 1
    assert check_params(os.path.join(a, "step_0"), os.path.join(b, "step_0")) is True


def test_tolerances_do_not_stick_between_calls(tmp_path):
    root, a, b = _two_step_dumps(tmp_path, perturb_step=0)
    cfg = {"atol": 1e3}
    assert check_report(a, b, cfg) is True
    assert cfg == {"atol": 1e3}  # the cfg is not filled in
    assert check_report(a, b) is False
    assert check_report(a, b, {"rtol": 1e3}) is True
    assert check_report(a, b, {}) is False
    assert check_weights(a, b, {"atol": 1.0}) is True
    assert check_weights(a, b) is False


class Flip(nn.Module):
    def forward(self, x):
        return x.flip(-1)


def _flip_model(flip: bool):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), Flip() if flip else nn.Identity())


def test_default_compare_is_elementwise_strict(tmp_path, capsys):
    root = str(tmp_path / "flip")
    base, raw = create_model(_flip_model(False), "base"), create_model(_flip_model(True), "raw")
    x = torch.randn(3, 4)
    for rec in (base, raw):
        rec(x)
        rec.try_dump(root)
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    # the same numbers in another order: equal means, different elements
    assert check_report(a, b) is False
    assert "DIFF at key '1' (call 0): leaf differs" in capsys.readouterr().out
    assert check_report(a, b, {"compare_mode": "mean"}) is True
    assert check_report(a, b, {"compare_mode": "strict"}) is False
    base.close(), raw.close()


# -------------------------------------------------------------------------- 7. bad input


def test_missing_dump_path(tmp_path):
    root, a, b = _two_step_dumps(tmp_path, perturb_step=None)
    missing = str(tmp_path / "nowhere" / "raw")
    for check in (check_report, check_params, check_weights, check_grads):
        with pytest.raises(FileNotFoundError, match="nowhere"):
            check(a, missing)
        with pytest.raises(FileNotFoundError, match="nowhere"):
            check(missing, b)


def test_dumps_of_different_models(tmp_path):
    root = str(tmp_path / "models")
    base, raw = create_model(make(), "base"), create_model(make(n_blocks=3), "raw")
    for rec in (base, raw):
        rec(**ids_input()[0])
        rec.try_dump(root)
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    with pytest.raises(ValueError, match=r"different models.*key 'blocks\.2'"):
        check_report(a, b)
    with pytest.raises(ValueError, match=r"blocks\.2\."):
        check_weights(a, b)
    base.close(), raw.close()


def test_mismatched_step_counts(tmp_path):
    root = str(tmp_path / "counts")
    base, raw = create_model(make(), "base"), create_model(make(), "raw")
    for rec, steps in ((base, 2), (raw, 1)):
        for _ in range(steps):
            rec(**ids_input()[0])
            rec.try_dump(root)
    a, b = os.path.join(root, "base"), os.path.join(root, "raw")
    with pytest.raises(ValueError, match="step counts differ"):
        check_report(a, b)
    with pytest.raises(ValueError, match="step counts differ"):
        check_params(a, b)
    # one step dir against one step dir still works
    assert check_report(os.path.join(a, "step_0"), os.path.join(b, "step_0")) is True
    base.close(), raw.close()


def test_inputs_must_be_a_pair_of_dicts(tmp_path):
    ids = ids_input()[0]["ids"]
    base, raw = make(), make()
    for bad in ((ids, ids), {"ids": ids}, ({"ids": ids},), [ids_input()[0]] * 3):
        with pytest.raises(TypeError, match="inputs"):
            auto_diff(base, raw, bad, dump_root=str(tmp_path / "x"))
    with pytest.raises(TypeError, match="pair"):
        auto_diff(base, raw, ids_input(), loss_fns=lambda o: o.sum())
    assert hooks_left(base) == 0 and hooks_left(raw) == 0


class Boom(RuntimeError):
    pass


class ExplodingBlock(Block):
    """Runs its first sub-layers (recorded), then raises."""

    def forward(self, x):
        self.attn(self.ln1(x))
        raise Boom("forward")


def test_models_left_unchanged_after_auto_diff_raises(tmp_path):
    inputs = ids_input()
    base, raw = make(), make(fault="scale")
    with torch.no_grad():
        before = (base(**inputs[0]), raw(**inputs[1]))

    def bad_loss(out):
        raise Boom("loss")

    with pytest.raises(Boom, match="loss"):
        auto_diff(base, raw, inputs, loss_fns=(SQ_LOSS, bad_loss), dump_root=str(tmp_path / "1"))
    assert hooks_left(base) == 0 and hooks_left(raw) == 0

    good = raw.blocks[1]
    raw.blocks[1] = ExplodingBlock(DIM)
    with pytest.raises(Boom, match="forward"):
        auto_diff(base, raw, inputs, auto_init=False, dump_root=str(tmp_path / "2"))
    assert hooks_left(base) == 0 and hooks_left(raw) == 0
    raw.blocks[1] = good

    # the models still run and compute what they did before
    with torch.no_grad():
        assert torch.equal(base(**inputs[0]), before[0])
        assert torch.equal(raw(**inputs[1]), before[1])  # same seed: the same weights
        assert not torch.equal(before[0], before[1])  # the scale fault
    assert raw.blocks[0].attn.q.weight.equal(base.blocks[0].attn.q.weight)


# ----------------------------------------------------------------------- 8. try_dump


def test_try_dump_every_dump_freq_steps_and_always_clears(tmp_path):
    root = str(tmp_path / "freq")
    rec = create_model(make(), "net", dump_freq=2, dump_root=root)
    dumped = []
    for _ in range(3):
        rec(**ids_input()[0])
        dumped.append(rec.try_dump())
        assert rec._calls == []
    assert dumped == [True, False, True] and rec.step == 3
    assert sorted(os.listdir(os.path.join(root, "net"))) == ["step_0", "step_2"]
    files = sorted(os.listdir(rank_dir(root, "net", 2)))
    assert files == sorted(
        ["report.json", "tensors.safetensors", "params.json", "weights.safetensors"]
        + ["grads.safetensors"]
    )
    assert len(report_routes(rank_dir(root, "net", 2))) > 10
    # a report dumped right after try_dump is empty
    other = str(tmp_path / "other")
    rec.set_dump_root_path(other)
    rec.dump_report()
    assert report_routes(rank_dir(other, "net", 3)) == []
    rec.close()
    with pytest.raises(ValueError, match="dump_freq"):
        create_model(make(), dump_freq=0)


# --------------------------------------------------------------- 9. results unchanged


def test_recorder_does_not_change_results(tmp_path):
    model = make()
    inputs = ids_input()[0]
    out = model(**inputs)
    out.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    rec = create_model(model, "net")
    assert rec.model is model
    rec_out = rec(**inputs)
    assert torch.equal(rec_out, out)
    rec.backward(rec_out.pow(2).mean())
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n
    assert len(rec._calls) == len(dict(model.named_modules())) - 1  # all but the ModuleList
    rec.close()
    assert hooks_left(model) == 0
    assert torch.equal(model(**inputs), out)
    with pytest.raises(TypeError, match="nn.Module"):
        create_model(lambda x: x)
