"""Model contracts the parity suites left open, each against an independent reference:
transformers on the same weights (classifier dropout, RoBERTa training outputs, Llama's
padding mask through the runner, T5's encoder pass), the plain-PyTorch Megatron T5 of
test_t5_megatron (keyword hyper-parameters, the cross mask through the runner, a pipeline
split), hand-derived values (BERT's pipeline target, Swin's attention dropout, GraphBase's
fp16 step and loss scale), transformers' own config defaults / dtype reading, torch's
weights-only loading, and the single-process run for Llama's tied head on tp2 + sequence
parallel (2 gloo ranks)."""

from __future__ import annotations

import copy
import fractions
import json
import pickle
import types

import pytest
import torch
import transformers
from test_hf_llama import build_hf as build_hf_llama
from test_hf_roberta import BATCH as ROBERTA_BATCH
from test_hf_roberta import make_batch as roberta_batch
from test_hf_roberta import tiny_config as roberta_config
from test_hf_t5 import build_hf as build_hf_t5
from test_t5_megatron import CFG as MEGATRON_CFG
from test_t5_megatron import libai_batch, reference_logits

from libai import dist
from libai.models import BertForClassification, BertForPreTraining, LlamaForCausalLM, ResMLP
from libai.models.swin_layers import SwinBlock
from libai.models.t5_megatron import MegatronT5ForPreTraining
from libai.models.utils import CheckpointError, GraphBase, load_huggingface, save_huggingface
from libai.models.utils.hf_io import CheckpointReader
from libai.runtime.memory_estimator import CountingDistUtil
from libai.runtime.parallel import ModelRunner, prune_to_stages

BERT_TINY = dict(
    vocab_size=50,
    hidden_size=16,
    hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


@pytest.fixture(autouse=True)
def single_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def stand_in_stages(stage_ids: list[int]):
    """A mesh stand-in answering only ``get_layer_stage`` (what ``prune_to_stages`` asks)."""

    def get_layer_stage(layer_idx: int) -> int:
        return stage_ids[layer_idx]  # -1: the last layer, as DistUtil

    return types.SimpleNamespace(get_layer_stage=get_layer_stage)


# ---- BERT -----------------------------------------------------------------------------------
@pytest.mark.parametrize("classifier_dropout", [0.3, None])
def test_bert_classifier_dropout_is_transformers(classifier_dropout, tmp_path):
    """The classification head's dropout probability is transformers' for the same
    config.json: ``classifier_dropout`` when set, else ``hidden_dropout_prob``."""
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.1,
        classifier_dropout=classifier_dropout,
    )
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(config)
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path))
    assert isinstance(model, BertForClassification)
    assert model.dropout.p == pytest.approx(hf.dropout.p)


def test_bert_classification_default_num_labels_is_transformers():
    """Without ``num_labels`` the head has transformers' default number of labels
    (``BertConfig().num_labels``): logits ``[batch, 2]``."""
    torch.manual_seed(0)
    model = BertForClassification(cfg=BERT_TINY).eval()
    want = transformers.BertConfig().num_labels
    assert model.classifier.weight.shape[0] == want
    ids = torch.randint(1, 50, (3, 6))
    assert model(ids, torch.ones_like(ids))["logits"].shape == (3, want)


def test_bert_pipeline_target_without_ns_labels():
    """A batch without ``ns_labels``: ``[lm labels masked to -100 where loss_mask is 0 |
    -100]`` (hand-built), i.e. no next-sentence loss."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg=BERT_TINY)
    lm = torch.tensor([[5, 6, 7], [8, 9, 10]])
    loss_mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    want = torch.tensor([[5, -100, 7, -100], [-100, -100, 10, -100]])
    got = model.pipeline_target({"lm_labels": lm, "loss_mask": loss_mask})
    assert torch.equal(got, want)


# ---- Llama ----------------------------------------------------------------------------------
def test_llama_keyword_hyper_parameters_build_the_model():
    """``LlamaForCausalLM(**hyper-parameters)`` builds those sizes (not the defaults): the
    embedding is ``[vocab, hidden]``, the logits cover the given vocabulary."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        hidden_layers=1,
        vocab_size=37,
        hidden_size=16,
        intermediate_size=24,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    ).eval()
    assert tuple(model.model.embed_tokens.weight.shape) == (37, 16)
    assert len([m for m in model.modules() if type(m).__name__ == "TransformerLayer"]) == 1
    ids = torch.randint(0, 37, (2, 5))
    assert model(ids)["logits"].shape == (2, 5, 37)


def test_llama_runner_predict_reads_the_attention_mask(tmp_path):
    """``ModelRunner.predict`` (the pipeline contract on one process) applies the batch's
    ``attention_mask``: left-padded rows give transformers' logits at the real tokens."""
    torch.manual_seed(0)
    hf = build_hf_llama("llama").eval()
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path)).eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 101, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: the real tokens must not attend to it
    mask[1, :1] = 0
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ModelRunner(model).predict({"input_ids": ids, "attention_mask": mask})
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)


# ---- ResMLP ---------------------------------------------------------------------------------
def test_resmlp_final_affine_belongs_to_the_last_stage():
    """Pruned to stage 0 of a two-stage split, ResMLP keeps only stage 0's parameters: the
    final Affine norm (built with ``layer_idx=-1``, like the head) is dropped with the head."""
    torch.manual_seed(0)
    model = ResMLP(img_size=16, patch_size=4, in_chans=3, embed_dim=12, depth=2, num_classes=5)
    prune_to_stages(model, {0}, stand_in_stages([0, 1]))
    names = {n for n, _ in model.named_parameters()}
    assert model.norm is None and model.head is None
    assert not any(n.startswith(("norm.", "head.", "blocks.1.")) for n in names), names
    assert any(n.startswith("blocks.0.") for n in names)


# ---- RoBERTa --------------------------------------------------------------------------------
def test_roberta_masked_lm_training_outputs(tmp_path):
    """In training, without labels the model returns transformers' logits; with labels only
    the loss (the documented ``{"lm_loss"}``)."""
    torch.manual_seed(0)
    hf = transformers.RobertaForMaskedLM(roberta_config()).eval()
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path)).train()  # dropouts are 0: train == eval maths
    ids, mask, labels = roberta_batch(0, predicted=2, skip=1)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        out = model(ids, mask)
        assert set(out) == {"logits"}
        real = mask.bool()
        torch.testing.assert_close(out["logits"][real], want[real], rtol=1e-4, atol=1e-4)
        loss_mask = (labels != -100).long()
        trained = model(ids, mask, lm_labels=labels.clamp(min=0), loss_mask=loss_mask)
    assert set(trained) == {"lm_loss"}
    assert ids.shape[0] == ROBERTA_BATCH


# ---- Swin -----------------------------------------------------------------------------------
def test_swin_block_attention_dropout_is_attn_drop():
    """``attn_drop`` is the dropout of the attention probabilities, ``drop`` the one after
    the projection: with ``attn_drop=1`` (every probability dropped) and ``drop=0`` the
    attention output in training is the projection's bias alone (0 @ W + b)."""
    torch.manual_seed(0)
    block = SwinBlock(
        8, (4, 4), 2, 4, 0, 2.0, True, 0.0, 1.0, 0.0,
        cosine=False, qk_scale=None, pretrained_window=0, layernorm_epsilon=1e-5, layer_idx=0,
    )  # fmt: skip
    attn = block.attn.train()
    bias = torch.arange(8, dtype=torch.float32) / 7 - 0.5
    with torch.no_grad():
        attn.proj.bias.copy_(bias)
        out = attn(torch.randn(2, 16, 8))
    torch.testing.assert_close(out, bias.expand(2, 16, 8), rtol=0, atol=1e-6)


# ---- Megatron T5 ----------------------------------------------------------------------------
def megatron_model(**kwargs) -> MegatronT5ForPreTraining:
    """test_t5_megatron's model (random, large weights) built from keyword arguments."""
    torch.manual_seed(0)
    model = MegatronT5ForPreTraining(**kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if name.endswith("bias") or "layernorm" in name else 0.3
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


def megatron_reference(model, batch):
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    heads, layers = MEGATRON_CFG["num_attention_heads"], MEGATRON_CFG["hidden_layers"]
    return reference_logits(weights, batch, heads, layers)


def test_megatron_t5_keyword_hyper_parameters_and_runner_masks():
    """Built from keyword hyper-parameters, run through ``ModelRunner.predict`` with LiBai's
    three masks (the cross mask included): the plain-PyTorch reference's logits."""
    model = megatron_model(**MEGATRON_CFG)
    batch = libai_batch()
    want = megatron_reference(model, batch)
    inputs = {k: v for k, v in batch.items() if k not in ("lm_labels", "loss_mask")}
    got = ModelRunner(model).predict(inputs)
    real = batch["loss_mask"].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_megatron_t5_pipeline_split_without_the_decoder_norm():
    """Layers [enc 0, enc 1, dec 0 | dec 1]: stage 0 holds a decoder layer but not the
    decoder's final LayerNorm, hands the un-normed decoder states on; stage 1 finishes; the
    two stages together give the reference's logits."""
    model = megatron_model(cfg=MEGATRON_CFG)
    batch = libai_batch()
    want = megatron_reference(model, batch)
    first, last = model, copy.deepcopy(model)
    stages = stand_in_stages([0, 0, 0, 1])
    prune_to_stages(first, {0}, stages)
    prune_to_stages(last, {1}, stages)
    assert first.t5_model.decoder.final_layernorm is None
    masks = {
        "encoder_mask": batch["encoder_attn_mask"],
        "decoder_mask": batch["decoder_attn_mask"],
        "cross_mask": batch["encoder_decoder_attn_mask"],
    }
    with torch.no_grad():
        handed = first.pipeline_forward(
            batch["encoder_input_ids"], batch["decoder_input_ids"], **masks
        )
        got = last.pipeline_forward(*handed, **masks)
    real = batch["loss_mask"].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


# ---- T5 (Hugging Face) ----------------------------------------------------------------------
def test_t5_encode_stage_is_transformers_encoder(tmp_path):
    """``encode_stage`` on the whole model (generation's encoder pass): token ids and a
    padding mask in, transformers' encoder ``last_hidden_state`` out."""
    hf = build_hf_t5("t5").eval()
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path)).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 99, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    with torch.no_grad():
        want = hf.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model.encode_stage(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)


# ---- GraphBase ------------------------------------------------------------------------------
class Quadratic(torch.nn.Module):
    """``loss = sum((w * x)^2)``: elementwise ops only, so fp16 autocast leaves it fp32 and
    the gradient is exactly ``2 * w * x^2``."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x):
        return {"loss": ((self.w * x) ** 2).sum()}


@pytest.fixture
def no_compile(monkeypatch):
    """GraphBase compiles the model; the step logic is what is tested, so skip compiling."""
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)


@pytest.mark.parametrize("steps", [0, -1, 2.0])
def test_graph_base_refuses_non_positive_int_accumulation(steps, no_compile):
    """``grad_acc_steps`` must be a positive int (0, -1, 2.0 refused)."""
    model = Quadratic()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="grad_acc_steps must be a positive int"):
        GraphBase(model, opt, grad_acc_steps=steps, device="cpu")


def test_graph_base_fp16_step_is_sgd(no_compile):
    """fp16 training on CPU: the loss-scaled step still applies plain SGD,
    ``w - lr * 2 * w * x^2`` (the scale, a power of two, cancels exactly)."""
    model = Quadratic()
    w0 = model.w.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    graph = GraphBase(model, opt, fp16=True, device="cpu")
    x = torch.tensor([1.0, 2.0, -0.5])
    graph(x=x)
    torch.testing.assert_close(model.w.detach(), w0 - 0.1 * 2 * w0 * x**2, rtol=0, atol=1e-7)


def test_graph_base_fp16_initial_scale_is_65536_times_dp(no_compile):
    """LiBai's initial loss scale is ``65536 x dp`` (dp of the model's mesh: here the current
    one, a dp4 stand-in, as the model has no libai layers)."""
    layout = dist.resolve_layout({"data_parallel_size": 4}, 4)
    model = Quadratic()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dist.use_dist_util(CountingDistUtil(layout, 0)):
        graph = GraphBase(model, opt, fp16=True, device="cpu")
    assert graph.grad_scaler.scale == 65536.0 * 4
    assert graph.grad_scaler.growth_interval == 2000


# ---- export ---------------------------------------------------------------------------------
def test_export_dtype_is_read_back_by_transformers(tmp_path):
    """``save_huggingface(dtype=float16)`` writes a config.json whose dtype transformers
    reads back as ``torch.float16``."""
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path / "hf")
    model = load_huggingface(str(tmp_path / "hf"))
    save_huggingface(model, str(tmp_path / "out"), dtype=torch.float16)
    read = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert read.dtype == torch.float16
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "float16"


def test_bin_checkpoint_is_read_weights_only_whatever_the_environment(tmp_path, monkeypatch):
    """A pytorch_model.bin pickling an arbitrary object is refused, as torch's own
    ``weights_only=True`` load refuses it, even when TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
    flips torch's default for callers that do not ask for weights only."""
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(2), "payload": fractions.Fraction(1, 3)}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="cannot read"):
        CheckpointReader(str(tmp_path))


# ---- Llama, tied head under sequence parallelism (2 gloo ranks) -----------------------------
def test_llama_tied_head_under_sequence_parallel_equals_one_process(tmp_path):
    """Llama with ``tie_word_embeddings`` on tp2 + sequence parallel: the head all-gathers
    the sequence shards, so losses, first-step gradients and trained parameters equal the
    single-process run (no sequence parallelism) within fp32 rounding."""
    from gpt_reference import GRAD_TOL, reference_run
    from launch import torchrun
    from sp_reference import build_llama, llama_batch, llama_state

    def build_tied():
        return build_llama(tie_word_embeddings=True)

    path = tmp_path / "references.pt"
    torch.save(
        {"llama": reference_run(build=build_tied, batch=llama_batch, state=llama_state)}, path
    )
    dist.reset_dist_util()
    case = {
        "name": "llama-tied-tp2",
        "model": "llama",
        "dist": {"tensor_parallel_size": 2},
        "model_kwargs": {"tie_word_embeddings": True},
    }
    results = torchrun("sequence_parallel.py", 2, str(path), json.dumps([case]))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
        (item,) = result["cases"]
        assert item["init_diff"] == 0.0, item["init_worst"]
        assert item["loss_diff"] <= GRAD_TOL, item["losses"]
        assert item["grad_diff"] <= GRAD_TOL, (item["grad_worst"], item["grad_diff"])
        assert item["final_diff"] <= GRAD_TOL, (item["final_worst"], item["final_diff"])
        assert item["shapes"]["head_out"][1] == llama_batch(0)["input_ids"].shape[1]
