"""What LiBai's config files name that is not ours: OneFlow's names (mapped onto torch while
a config loads), LAMB, GraphBase, and LiBai's model / tokenizer / train keys."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn

from libai import dist
from libai.config import LazyConfig, instantiate


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})


def write(tmp_path, text: str):
    path = tmp_path / "config.py"
    path.write_text(text)
    return str(path)


def test_oneflow_names_resolve_to_torch_only_while_a_config_loads(tmp_path):
    cfg = LazyConfig.load(
        write(
            tmp_path,
            "import oneflow as flow\n"
            "from oneflow.optim import SGD\n"
            "from libai.config import LazyCall\n"
            "optim = LazyCall(flow.optim.AdamW)(params=None, lr=0.5, do_bias_correction=True)\n"
            "extra = dict(dtype=flow.bfloat16, sgd=SGD, loss=LazyCall(flow.nn.MSELoss)())\n",
        )
    )
    assert "oneflow" not in sys.modules  # nothing installed or shadowed outside config files
    with pytest.raises(ImportError):
        import oneflow  # noqa: F401
    assert cfg.extra.dtype is torch.bfloat16 and cfg.extra.sgd == "torch.optim.SGD"
    assert isinstance(instantiate(cfg.extra.loss), nn.MSELoss)
    cfg.optim.params = [nn.Parameter(torch.ones(2))]
    optim = instantiate(cfg.optim)
    assert isinstance(optim, torch.optim.AdamW) and optim.defaults["lr"] == 0.5
    cfg.optim.do_bias_correction = False
    with pytest.raises(ValueError, match="do_bias_correction=False"):
        instantiate(cfg.optim)


def test_an_unmapped_oneflow_name_is_one_line_naming_it(tmp_path):
    from libai.utils.errors import OneLineError

    path = write(tmp_path, "import oneflow as flow\nx = dict(opt=flow.optim.RMSprop)\n")
    with pytest.raises(ImportError, match=r"oneflow\.optim\.RMSprop .* no mapping") as err:
        LazyConfig.load(path)
    assert isinstance(err.value, OneLineError) and "\n" not in str(err.value)


def lamb_reference(w, grads, lr, betas, eps, wd):
    """LAMB written out (You et al. 2019, Algorithm 2 with bias correction)."""
    w, m, v = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        r = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps) + wd * w
        trust = (w.norm() / r.norm()).item()
        w = w - lr * trust * r
    return w


def test_lamb_equals_the_formula():
    from libai.optim.oneflow_optim import LAMB

    torch.manual_seed(0)
    start = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(3)]
    p = nn.Parameter(start.clone())
    opt = LAMB([p], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = lamb_reference(start, grads, 0.01, (0.9, 0.99), 1e-6, 0.1)
    torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)


class _Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": ((self.linear(x) - y) ** 2).mean()}


def test_graph_base_trains_as_the_eager_step_it_compiles():
    """A training GraphBase with two accumulation steps: forward, backward and the optimizer
    step equal the same step written out eagerly."""
    from libai.models.utils import GraphBase

    torch.manual_seed(0)
    model = _Regression()
    twin = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    graph = GraphBase(
        model, torch.optim.SGD(model.parameters(), lr=0.1), grad_acc_steps=2, device="cpu"
    )
    out = graph(x=x, y=y)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    total = 0.0
    for xs, ys in zip(x.chunk(2), y.chunk(2)):
        loss = twin(xs, ys)["loss"] / 2
        loss.backward()
        total += float(loss)
    opt.step()
    assert float(out["loss"]) == pytest.approx(total, rel=1e-6)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b)
    evaluation = GraphBase(model, is_train=False, device="cpu")
    torch.testing.assert_close(evaluation(x=x, y=y)["loss"], model(x, y)["loss"])
    with pytest.raises(ValueError, match="train.zero_optimization"):
        GraphBase(model, torch.optim.SGD(model.parameters(), lr=0.1), zero_optim=True)


def test_residual_after_the_layernorm_equals_its_formula():
    """LiBai's apply_residual_post_layernorm: ``h = ln(x); h + attn(h)``, then the same for
    the MLP (against the block's own submodules, called by hand)."""
    from libai.layers import TransformerLayer

    torch.manual_seed(0)
    layer = TransformerLayer(8, 16, 2, apply_residual_post_layernorm=True).eval()
    x = torch.randn(2, 5, 8)
    h = layer.input_layernorm(x)
    h = h + layer.self_attention(h)
    n = layer.post_cross_attention_layernorm(h)
    torch.testing.assert_close(layer(x), n + layer.mlp(n))
    plain = TransformerLayer(8, 16, 2).eval()
    plain.load_state_dict(layer.state_dict())
    assert not torch.allclose(plain(x), layer(x))


def test_gpt_takes_libai_model_keys(caplog):
    """LiBai's GPT keys: fusion switches and amp_enabled are accepted and named as having no
    effect; use_scaled_init_for_output_weights=False initializes the output layers with the
    plain std; an unknown key is still an error."""
    from libai.models import GPTModel

    cfg = dict(
        hidden_layers=2,
        vocab_size=64,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=2,
        bias_gelu_fusion=True,
        scale_mask_softmax_fusion=True,
        apply_query_key_layer_scaling=True,
        amp_enabled=False,
    )
    with caplog.at_level("INFO"):
        GPTModel(cfg=cfg)
    assert "bias_gelu_fusion" in caplog.text and "no effect" in caplog.text

    def output_std(scaled: bool) -> float:
        torch.manual_seed(0)
        big = dict(cfg, hidden_size=256, ffn_hidden_size=1024, hidden_layers=8)
        model = GPTModel(cfg=dict(big, use_scaled_init_for_output_weights=scaled))
        return float(model.transformer.layers["0"].mlp.dense_4h_to_h.weight.std())

    assert output_std(False) == pytest.approx(0.02, rel=0.05)
    assert output_std(True) == pytest.approx(0.02 / (2 * 8) ** 0.5, rel=0.05)
    with pytest.raises(ValueError, match="unknown config key model.cfg.bias_fusion"):
        GPTModel(cfg=dict(cfg, bias_fusion=True))


def test_gpt2_tokenizer_takes_libai_keywords(tmp_path, caplog):
    from bpe_helpers import write_hand_bpe

    from libai.tokenizer import GPT2Tokenizer

    vocab, merges = write_hand_bpe(tmp_path)
    with caplog.at_level("INFO"):
        tok = GPT2Tokenizer(vocab, merges, do_lower_case=True, do_chinese_wwm=True)
    assert "do_chinese_wwm=True has no effect" in caplog.text
    assert tok.encode("hello world") == GPT2Tokenizer(vocab, merges).encode("hello world")
    with pytest.raises(TypeError, match="vocab_size_x"):
        GPT2Tokenizer(vocab, merges, vocab_size_x=3)


def test_libai_train_file_is_read_with_its_own_keys():
    """LiBai's configs/common/train.py: OneFlow-only keys accepted (named as having no
    effect), ``eval_iter=1e5`` an int, keys it leaves out filled with the spec's defaults."""
    from pathlib import Path

    from libai.runtime.spec import RunSpec

    path = Path(__file__).resolve().parents[2] / "fixtures/libai/configs/common/train.py"
    train = LazyConfig.load(str(path)).train
    added = RunSpec.fill_defaults(train)
    assert "resume" in added and "amp.dtype" in added
    spec = RunSpec.from_config(train)
    assert spec.evaluation.eval_iter == 100000 and spec.evaluation.eval_metric == "Acc@1"
    assert spec.checkpointer.save_model_after_n_epoch is None


def test_relative_imports_between_config_files_keep_every_name():
    """LiBai's tests/config files (unmodified): ``from .dir1.dir1_a import dir1a_str`` and
    ``LazyConfig.load_rel("dir1_a.py", ("dir1a_str", "dir1a_dict"))`` give strings as well
    as dicts, as detectron2's LazyConfig does; a missing name is a KeyError naming it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "fixtures/libai/tests/config"
    cfg = LazyConfig.load(str(root / "root_cfg.py"))
    assert cfg.dir1a_dict.a == "modified" and cfg.dir1b_dict.a == 1
    assert (cfg.lazyobj.x, cfg.lazyobj.y) == ("base_a_1", "base_a_1_from_b")
    assert LazyConfig.load(str(root / "dir1" / "dir1_b.py"), "dir1b_str") == "base_a_1_from_b"
    with pytest.raises(KeyError, match="no 'nothing'"):
        LazyConfig.load(str(root / "dir1" / "dir1_a.py"), ("dir1a_str", "nothing"))


def test_libai_layer_names_equal_their_formulas():
    import math

    from libai.layers import DropPath, SinePositionalEmbedding, build_activation

    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(build_activation("quick_gelu")(x), x * torch.sigmoid(1.702 * x))
    torch.testing.assert_close(build_activation("squared_relu")(x), x.clamp(min=0) ** 2)
    torch.testing.assert_close(
        build_activation("gelu_tanh")(x),
        0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    )
    assert torch.equal(build_activation(None)(x), x)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        build_activation("swish")

    table = SinePositionalEmbedding(16, 6)(torch.tensor([[0, 5, 15]]))
    for j, p in enumerate((0, 5, 15)):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert float(table[0, j, 2 * i]) == pytest.approx(math.sin(angle), abs=1e-6)
            assert float(table[0, j, 2 * i + 1]) == pytest.approx(math.cos(angle), abs=1e-6)

    drop = DropPath(0.25)
    h = torch.ones(4000, 3)
    assert torch.equal(drop.eval()(h), h)
    torch.manual_seed(0)
    out = drop.train()(h)
    kept = out[:, 0] != 0
    assert torch.equal(out[kept], torch.full_like(out[kept], 1 / 0.75))  # whole samples
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))
    assert float(kept.float().mean()) == pytest.approx(0.75, abs=0.03)


def test_libai_checkpoint_messages_and_parser_paths():
    from libai.config import default_argument_parser
    from libai.utils.checkpoint import (
        get_missing_parameters_message,
        get_unexpected_parameters_message,
    )

    keys = ["encoder.3.weight", "encoder.3.bias", "head.weight"]
    assert get_missing_parameters_message(keys) == (
        "Some model parameters or buffers are not found in the checkpoint:\n"
        "  encoder.3.{bias, weight}\n  head.weight"
    )
    assert get_unexpected_parameters_message(["x"]).endswith("not used by the model:\n  x")
    args = default_argument_parser().parse_args(["--config-file", "a.py", "train.seed=3"])
    assert (args.config_file, args.opts, args.resume) == ("a.py", ["train.seed=3"], False)
