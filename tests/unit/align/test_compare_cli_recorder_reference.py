"""libai.align's tensor comparison, parameter entries, recorder and command line against
references known by construction: tensors with differences set on purpose (the expected
numbers worked out with plain torch formulas here), hand-built tiny torch models."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

from libai.align import cli
from libai.align.auto_diff import auto_diff
from libai.align.compare import (
    Node,
    ReportSide,
    TensorStore,
    compare_tensors,
    match_nodes,
    resolve_cfg,
)
from libai.align.params import param_entries
from libai.align.recorder import create_model

# ---------------------------------------------------------------------------- compare


def test_mean_mode_equal_nan_and_inf_means_are_equal_and_far_means_differ():
    """Mean mode: two tensors whose means are both NaN, or both +inf, agree (the same value
    on both sides); means 0.5 apart (hand-set) differ under atol 1e-6, rtol 1e-5."""
    cfg = resolve_cfg({"compare_mode": "mean"}, "log")
    a = torch.tensor([1.0, float("nan"), 2.0])
    b = torch.tensor([3.0, 4.0, float("nan")])  # NaN elsewhere: the means are both NaN
    d = compare_tensors(a, b, cfg)
    assert math.isnan(d.mean_a) and math.isnan(d.mean_b)
    assert d.equal is True
    a = torch.tensor([1.0, float("inf")])
    b = torch.tensor([float("inf"), 5.0])
    d = compare_tensors(a, b, cfg)
    assert d.mean_a == d.mean_b == math.inf
    assert d.equal is True
    a = torch.tensor([1.0, 2.0])  # mean 1.5
    b = torch.tensor([1.0, 1.0])  # mean 1.0: |1.5 - 1.0| = 0.5 > 1e-6 + 1e-5 * 1.0
    d = compare_tensors(a, b, cfg)
    assert (d.mean_a, d.mean_b) == (1.5, 1.0)
    assert d.equal is False


def test_cosine_mode_numbers_show_the_cosine():
    """Cosine mode: ``numbers()`` is ``cosine=<cos>`` with cos = x.y / (|x| |y|) computed
    here in plain torch (4 significant digits)."""
    cfg = resolve_cfg({"compare_mode": "cosine"}, "log")
    a = torch.tensor([1.0, 2.0, 3.0])
    b = torch.tensor([3.0, 2.0, 1.0])
    cos = (torch.dot(a, b) / (a.norm() * b.norm())).item()  # 10/14
    d = compare_tensors(a, b, cfg)
    assert d.numbers() == f"cosine={cos:.4g}"
    assert d.numbers() == "cosine=0.7143"


def test_details_report_the_count_of_nonfinite_values():
    """The statistics line of a side holding one inf and one NaN ends with
    ``nonfinite=2`` (counted by hand); a finite side has no such item."""
    cfg = resolve_cfg(None, "log")
    a = torch.tensor([1.0, float("inf"), float("nan"), 2.0])
    b = torch.tensor([1.0, 2.0, 3.0, 4.0])
    lines = compare_tensors(a, b, cfg).details()
    side_a = next(line for line in lines if line.startswith("A:"))
    side_b = next(line for line in lines if line.startswith("B:"))
    assert side_a.endswith("nonfinite=2")
    assert "nonfinite" not in side_b


def _side(name: str, keys: list[str]) -> ReportSide:
    store = TensorStore("unused.safetensors", "nobody")
    nodes = [Node(i, {"key": k, "route": k, "type": "Linear"}, store) for i, k in enumerate(keys)]
    return ReportSide(name, f"/dumps/{name}", [f"/dumps/{name}/rank_0"], nodes)


def test_missing_module_error_points_to_rename_rules_or_a_layer_map():
    """A module call only side A recorded raises ``ValueError`` whose text ends with the
    documented way out: rename rules or a layer map."""
    side_a = _side("A", ["fc1", "fc2"])
    side_b = _side("B", ["fc1"])
    with pytest.raises(ValueError) as info:
        match_nodes(side_a, side_b)
    text = str(info.value)
    assert "'fc2'" in text
    assert text.endswith('record with rename rules (report.json "rename": true) or a layer map')


# ---------------------------------------------------------------------------- params


class _Export:
    """A stand-in weight rule: ``export`` gives the named tensors it was built with."""

    def __init__(self, make):
        self.make = make

    def export(self, full):
        return self.make(full)


def test_param_entries_first_key_wins_and_later_keys_of_the_same_param_stay():
    """Parameter ``a`` exports key ``x``; parameter ``b`` exports ``x`` (already taken:
    dropped) and then ``y``: the entries are ``x`` from ``a`` and ``y`` from ``b``."""
    model = nn.Module()
    model.a = nn.Parameter(torch.tensor([1.0, 2.0]))
    model.b = nn.Parameter(torch.tensor([3.0, 4.0]))
    rules = {
        "a": _Export(lambda t: {"x": t}),
        "b": _Export(lambda t: {"x": t * 10, "y": t + 1}),
    }
    entries = param_entries(model, rules)
    assert [(e.key, e.name) for e in entries] == [("x", "a"), ("y", "b")]
    torch.testing.assert_close(entries[0].value, torch.tensor([1.0, 2.0]), rtol=0, atol=0)
    torch.testing.assert_close(entries[1].value, torch.tensor([4.0, 5.0]), rtol=0, atol=0)


# ---------------------------------------------------------------------------- recorder


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _tiny(dtype) -> nn.Module:
    torch.manual_seed(0)
    return _Tiny().to(dtype)


def test_single_step_with_a_float64_base_and_a_float32_raw(tmp_path):
    """single_step feeds the float32 raw model the float64 base model's output gradients;
    they are cast to float32, so the run completes and the two (same weights) agree under
    a tolerance far above float32 rounding."""
    x = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
    ok = auto_diff(
        _tiny(torch.float64),
        _tiny(torch.float32),
        ({"x": x.double()}, {"x": x}),
        loss_fns=(lambda o: o.pow(2).sum(), lambda o: o.pow(2).sum()),
        atol=1e-4,
        rtol=1e-4,
        auto_init=False,
        single_step=True,
        dump_root=str(tmp_path / "dump"),
    )
    assert ok is True


def test_auto_layer_map_picks_transformers_and_libai_attention(tmp_path):
    """auto_layer_map maps the attention modules: ``GPT2Attention`` (``transformer.h.<i>
    .attn``) of a 2-layer transformers GPT-2 and libai's ``MultiheadAttention``
    (``...layers.<i>.self_attention``) of a 2-layer libai GPT; nothing else."""
    transformers = pytest.importorskip("transformers")
    from libai import dist
    from libai.config import LazyCall, instantiate
    from libai.models import GPTForPreTraining

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    )
    rec = create_model(hf, "hf")
    assert rec.auto_layer_map("base") == ["transformer.h.0.attn", "transformer.h.1.attn"]
    rec.close()
    dist.setup_dist_util({})
    lb = instantiate(
        LazyCall(GPTForPreTraining)(
            cfg=dict(
                hidden_layers=2,
                vocab_size=50,
                hidden_size=16,
                ffn_hidden_size=64,
                num_attention_heads=2,
                max_seq_length=32,
            )
        )
    )
    rec = create_model(lb, "libai")
    assert rec.auto_layer_map("raw") == [
        "GPT_model.transformer.layers.0.self_attention",
        "GPT_model.transformer.layers.1.self_attention",
    ]
    rec.close()


# ---------------------------------------------------------------------------- cli


class _LM(nn.Module):
    """Embedding -> linear head, returning ``{"logits": ...}`` plus a constant ``offset``
    added to every logit (a forward difference set on purpose that leaves the softmax, and
    so the loss and every gradient, unchanged)."""

    VOCAB = 7

    def __init__(self, offset: float):
        super().__init__()
        torch.manual_seed(0)
        self.config = types.SimpleNamespace(vocab_size=self.VOCAB)
        self.emb = nn.Embedding(self.VOCAB, 4)
        self.head = nn.Linear(4, self.VOCAB)
        with torch.no_grad():  # |logits| < 0.5: the rtol term stays below 5e-6
            self.emb.weight.uniform_(-0.5, 0.5)
            self.head.weight.uniform_(-0.1, 0.1)
            self.head.bias.zero_()
        self.offset = offset

    def forward(self, input_ids):
        return {"logits": self.head(self.emb(input_ids)) + self.offset}


@pytest.mark.parametrize(("atol", "code"), [("1e-3", 0), ("1e-5", 1)])
def test_run_compares_activations_with_the_given_atol(tmp_path, monkeypatch, capsys, atol, code):
    """Logits 1e-4 apart (set on purpose): ``--atol 1e-3`` passes (exit 0), ``--atol 1e-5``
    fails (exit 1): 1e-4 > 1e-5 + 1e-5 * 0.5."""
    models = {"base": _LM(0.0), "raw": _LM(1e-4)}
    monkeypatch.setattr(cli, "load_side", lambda side, seed: models[side.path])
    args = cli.parse_args(
        ["--base", "hf:base", "--raw", "hf:raw", "--atol", atol, "--dump-root", str(tmp_path)]
    )
    sides = (cli.Side("--base", "hf:base", "hf", "base"), cli.Side("--raw", "hf:raw", "hf", "raw"))
    assert cli.run(args, *sides) == code
    assert ("align: PASS" if code == 0 else "align: FAIL") in capsys.readouterr().out


def test_load_checkpoint_takes_the_vocab_size_saved_in_the_checkpoint(
    tmp_path, monkeypatch, capsys
):
    """A trainer checkpoint saved with vocab 56 (padded) while config.yaml says 50: the model
    is rebuilt with 56 rows and gets the saved weights, and rank 0 prints a note."""
    from libai import dist
    from libai.checkpoint.checkpointer import Checkpointer
    from libai.config import LazyConfig, instantiate

    monkeypatch.delenv("RANK", raising=False)
    config = tmp_path / "tiny_gpt.py"
    config.write_text(
        "from libai.config import LazyCall\n"
        "from libai.models import GPTForPreTraining\n\n"
        "model = LazyCall(GPTForPreTraining)(\n"
        "    cfg=dict(hidden_layers=1, vocab_size=50, hidden_size=16, ffn_hidden_size=32,\n"
        "             num_attention_heads=2, max_seq_length=16)\n"
        ")\n"
    )
    dist.setup_dist_util({})
    cfg = LazyConfig.load(str(config))
    cfg.model.cfg.vocab_size = 56
    torch.manual_seed(3)
    trained = instantiate(cfg.model)
    Checkpointer(trained, str(tmp_path / "run")).save("model_final", iteration=1)
    cfg = LazyConfig.load(str(config))  # vocab 50 again
    torch.manual_seed(4)
    model = cli._load_checkpoint(instantiate(cfg.model), cfg, str(tmp_path / "run/model_final"))
    assert "note: vocab_size 56 in the checkpoint (config.yaml says 50)" in capsys.readouterr().out
    saved = trained.state_dict()
    loaded = model.state_dict()
    assert set(loaded) == set(saved)
    for name, value in saved.items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=0, msg=name)
    assert any(v.shape[0] == 56 for v in loaded.values())
