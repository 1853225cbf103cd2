"""Each training switch shows its effect (not only that it runs), on one process."""

from __future__ import annotations

import copy

import pytest
import torch
from memory_probe import held_activation_bytes
from torch import nn

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.amp import DynamicLossScaler, resolve_amp_dtype
from libai.runtime.parallel import ModelRunner

GPT = dict(
    hidden_layers=2,
    vocab_size=64,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
)


@pytest.fixture(autouse=True)
def single_process():
    dist.setup_dist_util({})


def make_model(seed=0):
    torch.manual_seed(seed)
    return GPTForPreTraining(**GPT)


def make_batch(batch=4, seq=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, GPT["vocab_size"], (batch, seq + 1), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_bf16_autocast_runs_matmuls_in_bf16_and_stays_close():
    model = make_model()
    seen = []
    model.GPT_model.transformer.layers["0"].mlp.dense_h_to_4h.register_forward_hook(
        lambda m, i, o: seen.append(o.dtype)
    )
    fp32 = ModelRunner(model).forward_backward(make_batch())
    model.zero_grad()
    bf16 = ModelRunner(model, amp_dtype=resolve_amp_dtype("bf16")).forward_backward(make_batch())
    assert seen == [torch.float32, torch.bfloat16]
    assert bf16 != fp32 and abs(float(bf16) - float(fp32)) < 0.05
    # parameters and their gradients stay fp32 (master weights)
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()
    )


def test_fp16_overflow_skips_the_step_and_backs_off():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    scaler = DynamicLossScaler(init_scale=2.0**60, growth_interval=1)
    runner = ModelRunner(model, amp_dtype=torch.float16, loss_scaler=scaler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runner.train_step(make_batch(), optimizer)
    assert runner.last_step_skipped and scaler.scale == 2.0**59 and scaler.skipped_steps == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed on a skipped step"
    scaler.scale = 2.0**8  # a sane scale: the step is taken and the scale grows
    runner.train_step(make_batch(), optimizer)
    assert not runner.last_step_skipped and scaler.scale == 2.0**9
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_fp16_loss_scaling_rescues_gradients_that_underflow():
    ref, unscaled, scaled = make_model(), make_model(), make_model()
    ModelRunner(ref).forward_backward(make_batch())
    ModelRunner(unscaled, amp_dtype=torch.float16).forward_backward(make_batch())
    scaler = DynamicLossScaler(init_scale=2.0**14)
    ModelRunner(scaled, amp_dtype=torch.float16, loss_scaler=scaler).forward_backward(make_batch())
    assert not scaler.unscale_(scaled.parameters())

    def lost(model):  # gradient entries that fp16 flushed to zero
        return sum(
            int(((p.grad == 0) & (q.grad != 0)).sum())
            for p, q in zip(model.parameters(), ref.parameters())
        )

    assert lost(unscaled) > 0 and lost(scaled) == 0
    for p, q in zip(scaled.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-4)


def saved_activation_bytes(runner, batch):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        runner.forward_backward(batch)
    return total[0]


def test_activation_checkpointing_drops_saved_activations_and_keeps_gradients():
    plain, ckpt = make_model(), make_model()
    batch = make_batch(batch=8, seq=16)
    plain_bytes = saved_activation_bytes(ModelRunner(plain), batch)
    ckpt_runner = ModelRunner(ckpt, activation_checkpointing=True)
    ckpt_bytes = saved_activation_bytes(ckpt_runner, batch)
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    for (name, g1), g2 in zip(grads(plain).items(), grads(ckpt).values()):
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-6, msg=name)


def test_activation_checkpointing_without_blocks_raises():
    with pytest.raises(ValueError, match="has no TransformerLayer"):
        ModelRunner(nn.Linear(2, 2), activation_checkpointing=True)


def test_gradient_accumulation_equals_the_larger_batch():
    a, b = make_model(), make_model()
    loss_a = ModelRunner(a).forward_backward(make_batch(batch=8))
    loss_b = ModelRunner(b, num_microbatches=4).forward_backward(make_batch(batch=8))
    assert abs(float(loss_a) - float(loss_b)) < 1e-6
    for (name, ga), gb in zip(grads(a).items(), grads(b).values()):
        torch.testing.assert_close(ga, gb, rtol=0, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="not divisible by num_microbatches=3"):
        ModelRunner(b, num_microbatches=3).forward_backward(make_batch(batch=8))


def test_accumulation_averages_the_micro_batch_means():
    # micro-batches counting different numbers of tokens (labels -100 are not counted): the
    # accumulated loss and gradients are the mean of the micro-batch means, as in LiBai and
    # Megatron, which differs from the mean over all the batch's tokens
    batch = make_batch(batch=4)
    batch["labels"][:2, 3:] = -100
    ref, model = make_model(), make_model()
    halves = [{k: v[i : i + 2] for k, v in batch.items()} for i in (0, 2)]
    micro_losses = [ModelRunner(ref)._loss(half) for half in halves]
    want = sum(micro_losses) / 2
    want.backward()
    whole = ModelRunner(make_model())._loss(batch).item()
    got = float(ModelRunner(model, num_microbatches=2).forward_backward(batch))
    assert abs(got - want.item()) < 1e-6 and abs(got - whole) > 1e-3
    for (name, g), ref_g in zip(grads(model).items(), grads(ref).values()):
        torch.testing.assert_close(g, ref_g, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_step_under_loss_scale_two_has_twice_the_gradients(microbatches):
    # the same fp16 forward with and without a loss scaler of scale 2: the gradients the
    # step leaves (before unscale_) are twice the unscaled ones, the loss is the same
    plain, scaled = make_model(), make_model()
    loss = ModelRunner(
        plain, amp_dtype=torch.float16, num_microbatches=microbatches
    ).forward_backward(make_batch())
    scaler = DynamicLossScaler(init_scale=2.0)
    runner = ModelRunner(
        scaled, amp_dtype=torch.float16, loss_scaler=scaler, num_microbatches=microbatches
    )
    assert float(runner.forward_backward(make_batch())) == float(loss)
    for (name, g), ref in zip(grads(scaled).items(), grads(plain).values()):
        torch.testing.assert_close(g, 2 * ref, rtol=1e-3, atol=1e-4, msg=name)  # fp16 rounding


@pytest.mark.parametrize(("init_scale", "microbatches"), [(None, 1), (None, 4), (8.0, 2), (2.0, 1)])
def test_backward_of_a_custom_loop_scales_by_loss_scale_over_microbatches(init_scale, microbatches):
    # runner.backward(loss, n) is loss.backward() times (fp16 loss scale / n): powers of two,
    # so the gradients are the plain ones times that factor exactly
    ref, model = make_model(), make_model()
    ModelRunner(ref)._loss(make_batch()).backward()
    if init_scale is None:
        runner, factor = ModelRunner(model), 1.0 / microbatches
    else:
        scaler = DynamicLossScaler(init_scale=init_scale)
        runner = ModelRunner(model, amp_dtype=torch.float16, loss_scaler=scaler)
        factor = init_scale / microbatches
    loss = runner._loss(make_batch())  # an fp32 forward
    if microbatches == 1:
        runner.backward(loss)  # one micro-batch by default
    else:
        runner.backward(loss, num_microbatches=microbatches)
    for (name, g), want in zip(grads(model).items(), grads(ref).values()):
        assert torch.equal(g, want * factor), name
    # through backward_fn when one is given, with the same scaled loss
    seen = []
    runner.backward_fn = seen.append
    loss = torch.tensor(3.0)
    runner.backward(loss, num_microbatches=microbatches)
    assert len(seen) == 1 and float(seen[0]) == 3.0 * factor


def test_clipping_equals_torch_clip_grad_norm():
    a, b = make_model(), make_model()
    ModelRunner(a).forward_backward(make_batch())
    runner = ModelRunner(b)
    runner.forward_backward(make_batch())
    want = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.1)
    got = runner.clip_grad_norm_(0.1)
    torch.testing.assert_close(got, want)
    for (name, ga), gb in zip(grads(a).items(), grads(b).values()):
        torch.testing.assert_close(ga, gb, msg=name)


def test_compiled_blocks_match_eager():
    eager, compiled = make_model(), make_model()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled.parameters(), lr=0.1)
    run_e, run_c = ModelRunner(eager), ModelRunner(compiled, compile=True)
    assert all(
        layer._compiled_call_impl is not None
        for layer in compiled.GPT_model.transformer.layers.values()
    )
    for step in range(2):
        le = run_e.train_step(make_batch(seed=step), opt_e)
        lc = run_c.train_step(make_batch(seed=step), opt_c)
        assert abs(le - lc) < 1e-5, (step, le, lc)


def test_the_whole_model_compiled_matches_eager():
    """graph.compile_scope='model': the model's forward is one compiled graph (its blocks
    are not compiled on their own); the losses are eager's. Pipeline stages and ZeRO-3
    refuse the scope by name."""
    from libai.runtime.blocks import compile_mode

    eager, compiled = make_model(), make_model()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled.parameters(), lr=0.1)
    mode = compile_mode(True, "model", pipeline=False)
    run_e, run_c = ModelRunner(eager), ModelRunner(compiled, compile=mode)
    assert compiled._compiled_call_impl is not None
    assert all(
        layer._compiled_call_impl is None
        for layer in compiled.GPT_model.transformer.layers.values()
    )
    for step in range(2):
        le = run_e.train_step(make_batch(seed=step), opt_e)
        lc = run_c.train_step(make_batch(seed=step), opt_c)
        assert abs(le - lc) < 1e-5, (step, le, lc)
    assert compile_mode(True, None, pipeline=True) is True  # default: each block
    assert compile_mode(False, "model", pipeline=True) is False
    with pytest.raises(ValueError, match="graph.compile_scope='model' compiles .* pipeline"):
        compile_mode(True, "model", pipeline=True)
    with pytest.raises(ValueError, match="graph.compile_scope='model' with ZeRO stage 3"):
        compile_mode(True, "model", pipeline=False, zero_stage=3)
    with pytest.raises(ValueError, match=r"graph.compile_scope must be one of .* got 'layers'"):
        compile_mode(True, "layers", pipeline=False)


def test_bad_amp_settings_raise():
    with pytest.raises(ValueError, match="train.amp.dtype"):
        resolve_amp_dtype("fp8")
    with pytest.raises(ValueError, match="only used with fp16"):
        ModelRunner(make_model(), amp_dtype=torch.bfloat16, loss_scaler=DynamicLossScaler())


def test_selective_checkpointing_keeps_matmuls_and_recomputes_the_rest():
    """torchtitan's op-level policy: less memory than no checkpointing, more than full, the
    same gradients as both."""
    runs = {}
    batch = make_batch(batch=8, seq=16)
    for mode in (False, "selective", "full"):
        model = make_model()
        runs[mode] = (
            held_activation_bytes(ModelRunner(model, activation_checkpointing=mode), batch),
            grads(model),
        )
    none, selective, full = runs[False][0], runs["selective"][0], runs["full"][0]
    assert full < selective < none, (full, selective, none)
    for mode in ("selective", "full"):
        for (name, g1), g2 in zip(runs[False][1].items(), runs[mode][1].values()):
            torch.testing.assert_close(g1, g2, rtol=0, atol=1e-6, msg=f"{mode}: {name}")
    with pytest.raises(ValueError, match="activation_checkpoint.mode must be one of"):
        ModelRunner(make_model(), activation_checkpointing="some")


def test_the_training_step_does_not_read_the_device():
    """The loop keeps each step's loss and gradient norm as device tensors: they are read
    back when a writer logs them (one transfer for a window) and the finiteness check runs
    at the logging period, not every step."""
    from libai.runtime.trainer import EagerTrainer
    from libai.utils.events import EventStorage

    model = make_model()
    runner = ModelRunner(model)
    batches = [make_batch(seed=s) for s in range(4)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = EagerTrainer(runner, batches, optimizer, max_grad_norm=1.0)
    trainer.finite_check_period, trainer.max_iter = 10, 100
    with EventStorage(0) as trainer.storage:
        for trainer.iter in range(3):
            trainer.run_step()
        losses, norms = trainer.storage.history("total_loss"), trainer.storage.history("grad_norm")
        assert len(losses._pending) == 3 and len(norms._pending) == 3
        assert len(trainer._unchecked) == 3
        values = losses.values()  # a writer's read: one transfer, then plain floats
        assert not losses._pending and all(isinstance(v, float) for v, _ in values)
    trainer._unchecked[-1] = (2, torch.tensor(float("nan")))
    with pytest.raises(FloatingPointError, match="loss became nan at iteration 2"):
        trainer.check_finite()


@pytest.mark.parametrize(
    ("dtype", "init_scale", "want_scale"),
    [("fp16", 8.0, 8.0), ("fp16", None, 2.0**16), ("bf16", 8.0, None)],
)
def test_parallelize_gives_fp16_a_loss_scaler_that_the_runner_scales_by(
    dtype, init_scale, want_scale
):
    """fp16 (only) gets a dynamic loss scaler starting at ``amp.init_scale`` (2**16 when
    unset), and the runner parallelize builds uses it: the gradients are the unscaled fp16
    run's times that scale."""
    from libai.runtime.parallelize import parallelize
    from libai.runtime.spec import AmpSpec, RunSpec

    amp = AmpSpec(enabled=True, dtype=dtype, init_scale=init_scale)
    parts = parallelize(make_model(), RunSpec(amp=amp, num_accumulation_steps=1))
    assert parts.runner.loss_scaler is parts.grad_scaler
    if want_scale is None:
        assert parts.grad_scaler is None
        return
    assert parts.grad_scaler.scale == want_scale
    plain = make_model()
    ModelRunner(plain, amp_dtype=torch.float16).forward_backward(make_batch())
    parts.runner.forward_backward(make_batch())
    for (name, g), ref in zip(grads(parts.runner.model).items(), grads(plain).values()):
        torch.testing.assert_close(g, want_scale * ref, rtol=1e-3, atol=1e-4 * want_scale, msg=name)
