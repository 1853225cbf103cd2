"""libai.accelerate: each acceleration switch changes what it should, and the templates and
compose reproduce the black box's losses on the same data (one core)."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import transformers
from accelerate_helpers import compose_and_train, task_argv
from door_memory import check_zero_holdings
from launch import torchrun
from log_lines import LogLines
from train_net_helpers import read_metrics

from libai import dist
from libai.accelerate import AccelerateEngine, cli
from libai.accelerate.data import load_local_dataset
from libai.accelerate.tasks import get_task


def cls_argv(files, save, *extra, steps=6):
    return task_argv(files, "sequence_classification", save, *extra, steps=steps)


def distilbert(files):
    return transformers.AutoModelForSequenceClassification.from_pretrained(
        files["distilbert"], num_labels=2
    )


def a_batch(files, engine):
    task = get_task("sequence_classification")
    tok = transformers.AutoTokenizer.from_pretrained(files["distilbert"])
    prepared = task.prepare(load_local_dataset(str(files["cls"][0])), None, tok, engine.args)
    return torch.utils.data.default_collate([prepared.train[i] for i in range(8)]), prepared


def test_mixed_precision_autocasts_and_fp16_scales(accelerate_files, tmp_path):
    f = accelerate_files
    for flags, dtype in (([], torch.float32), (["--mixed-precision"], torch.bfloat16)):
        engine = AccelerateEngine(cls_argv(f, tmp_path, *flags))
        model, _, _ = engine.compose(distilbert(f), train_iters=2)
        batch, _ = a_batch(f, engine)
        assert model(**batch).logits.dtype == dtype
    engine = AccelerateEngine(
        cls_argv(f, tmp_path, "--mixed-precision", "--mixed-precision-dtype", "fp16")
    )
    engine.compose(distilbert(f), train_iters=2)
    assert engine.runner.loss_scaler is not None and engine.runner.amp_dtype == torch.float16


def saved_bytes_and_grads(engine, model, batch):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine.backward(model(**batch).loss)
    return total[0], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_checkpoint_activations_saves_less_and_keeps_gradients(accelerate_files, tmp_path):
    f = accelerate_files
    runs = {}
    for name, flags in (("plain", []), ("ckpt", ["--checkpoint-activations"])):
        engine = AccelerateEngine(cls_argv(f, tmp_path, *flags))
        model, _, _ = engine.compose(distilbert(f), train_iters=2)
        batch, _ = a_batch(f, engine)
        runs[name] = saved_bytes_and_grads(engine, model, batch)
    assert runs["ckpt"][0] < 0.6 * runs["plain"][0], (runs["ckpt"][0], runs["plain"][0])
    for name, grad in runs["plain"][1].items():
        torch.testing.assert_close(runs["ckpt"][1][name], grad, rtol=0, atol=1e-6, msg=name)


def test_graph_optimization_compiles_the_blocks(accelerate_files, tmp_path):
    f = accelerate_files
    with LogLines("libai.accelerate.arguments") as lines:
        for flag in ("--graph-optimization", "--onnx-runtime-training"):
            engine = AccelerateEngine(cls_argv(f, tmp_path, flag))
            engine.compose(distilbert(f), train_iters=2)
            layers = engine.runner.model.distilbert.transformer.layer
            assert all(layer._compiled_call_impl is not None for layer in layers)
    said = [line for line in lines if line.startswith("--onnx-runtime-training")]
    assert len(said) == 1, lines
    assert "compiles each block with torch.compile" in said[0]
    assert "on CPU the first, cold compile takes longer than a short run saves" in said[0]


def test_data_parallel_and_zero_switches_equal_one_process(accelerate_files, tmp_path):
    """dp2, --zero-1/2/3-memory-optimization and --fsdp-memory-optimization through compose on
    2 ranks: the loss of every step (the mean of the ranks' halves of the global batch)
    equals one process on the whole batch, and each switch splits what it must
    (door_memory: optimizer state from ZeRO-1, gradients from ZeRO-2, parameters at ZeRO-3
    and FSDP)."""
    f = accelerate_files
    flags = {
        "plain": [],
        "zero1": ["--zero-1-memory-optimization"],
        "zero2": ["--zero-2-memory-optimization"],
        "zero3": ["--zero-3-memory-optimization"],
        "fsdp": ["--fsdp-memory-optimization"],
    }
    runs = [
        {
            "kind": "zero",
            "name": name,
            "argv": cls_argv(f, tmp_path / name, *extra),
            "model_dir": str(f["distilbert"]),
        }
        for name, extra in flags.items()
    ]
    results = torchrun("accelerate_runs.py", 2, json.dumps(runs))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    dist.setup_dist_util({})
    one = compose_and_train(cls_argv(f, tmp_path / "one"), f["distilbert"])["losses"]
    for name in flags:
        got = [sum(r[name]["losses"][s] for r in results) / 2 for s in range(6)]
        assert got == pytest.approx(one, abs=1e-5), (name, got, one)
    plain = [r["plain"] for r in results]
    for name, stage in (("zero1", 1), ("zero2", 2), ("zero3", 3), ("fsdp", 3)):
        check_zero_holdings(plain, stage, [r[name] for r in results])


def test_data_parallel_ranks_read_disjoint_shares_of_the_global_batch(accelerate_files, tmp_path):
    """dp2 through the engine's loaders: at every training step the two ranks' samples are
    disjoint and together the one-process global batch of that step (same seed, same
    order); evaluation shards one pass over the set, every sample once."""
    f = accelerate_files
    flags = ["--micro-batch-size", "3", "--global-batch-size", "6"]
    argv = cls_argv(f, tmp_path / "dp2", *flags)
    runs = [{"kind": "loaders", "name": "ids", "argv": argv}]
    ranks = [r["ids"] for r in torchrun("accelerate_runs.py", 2, json.dumps(runs))]
    dist.setup_dist_util({})
    one = AccelerateEngine(cls_argv(f, tmp_path / "one", "--micro-batch-size", "6"))
    train = one.build_data_loader(list(range(24)), collate_fn=list, steps_per_epoch=2)
    want = [batch for _ in range(2) for batch in train]
    assert len(want) == 4 and all(len(b) == 6 for b in want)
    for step, batch in enumerate(want):
        a, b = ranks[0]["train"][step], ranks[1]["train"][step]
        assert len(a) == len(b) == 3 and not set(a) & set(b), (step, a, b)
        assert sorted(a + b) == sorted(batch), (step, a, b, batch)
    assert want[:2] != want[2:]  # reshuffled every epoch
    evaluated = [i for r in ranks for batch in r["eval"] for i in batch]
    assert sorted(evaluated) == list(range(10))


TEMPLATE = '''
import transformers

from libai.accelerate import Finetuner
from libai.accelerate.data import load_local_dataset
from libai.accelerate.tasks import TensorDictDataset


class ClassifierFinetuner(Finetuner):
    """A user's own template: tokenization and model written out by hand."""

    def train_valid_test_datasets_provider(self):
        args = self.args
        tok = transformers.AutoTokenizer.from_pretrained(args.pretrained_model_name_or_path)
        rows = load_local_dataset(args.data_path)
        enc = tok(list(rows["sentence1"]), list(rows["sentence2"]), padding="max_length",
                  truncation=True,
                  max_length=args.seq_length, return_tensors="pt")
        labels = {"neg": 0, "pos": 1}
        enc["labels"] = __import__("torch").tensor([labels[x] for x in rows["label"]])
        return TensorDictDataset(dict(enc)), None

    def model_optimizer_lr_scheduler_provider(self):
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            self.args.pretrained_model_name_or_path, num_labels=2
        )
        return model, None, None

    def run_forward_step(self, batch, model):
        return model(**batch).loss
'''


def test_templates_and_compose_reproduce_the_black_box(accelerate_files, tmp_path):
    f = accelerate_files
    steps = 6
    common = ["--eval-interval", "1000"]
    assert cli.main(cls_argv(f, tmp_path / "box", *common, steps=steps)) == 0
    box = [read_metrics(tmp_path / "box")[i]["total_loss"] for i in range(steps)]
    # the template, run by the black box's command line
    script = tmp_path / "my_finetuner.py"
    script.write_text(textwrap.dedent(TEMPLATE))
    argv = [a for a in cls_argv(f, tmp_path / "tpl", *common, steps=steps) if a != "--task"]
    argv.remove("sequence_classification")
    assert cli.main([*argv, "--user-script", str(script)]) == 0
    template = [read_metrics(tmp_path / "tpl")[i]["total_loss"] for i in range(steps)]
    assert template == box
    # compose: the loop of Rapidformer's page, on this rank's share of the same data
    engine = AccelerateEngine(cls_argv(f, tmp_path / "compose", *common, steps=steps))
    model = distilbert(f)
    _, prepared = a_batch(f, engine)
    model, optimizer, lr_scheduler = engine.compose(model)
    composed, loader = [], iter(engine.build_data_loader(prepared.train, steps_per_epoch=steps))
    for _ in range(steps):
        loss = model(**next(loader)).loss
        engine.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        composed.append(float(loss))
    assert composed == pytest.approx(box, abs=0, rel=0)


def test_compose_rebuilds_the_loaders_it_is_given(accelerate_files, tmp_path):
    """compose's loaders on this rank's share: the training one in batches of
    ``--micro-batch-size`` x accumulation (8 here, whatever the loader given had), the
    evaluation one in the given loader's batches, in order."""
    f = accelerate_files
    engine = AccelerateEngine(cls_argv(f, tmp_path, steps=2))
    _, prepared = a_batch(f, engine)
    train = torch.utils.data.DataLoader(prepared.train, batch_size=3)
    valid = torch.utils.data.DataLoader(prepared.train, batch_size=5)
    _, _, _, train_loader, valid_loader = engine.compose(
        distilbert(f), train_dataloader=train, eval_dataloader=valid
    )
    assert len(next(iter(train_loader))["labels"]) == 8
    first = next(iter(valid_loader))
    assert torch.equal(first["labels"], next(iter(valid))["labels"])


def test_model_chunks_stand_for_their_one_model():
    """The model Rapidformer's templates get (a list of chunks, one here) answers for its
    model: calls and attributes reach ``model[0]``."""
    from libai.accelerate.templates import ModelChunks

    linear = torch.nn.Linear(2, 3)
    chunks = ModelChunks([linear])
    assert chunks.weight is linear.weight and chunks.out_features == 3
    x = torch.ones(1, 2)
    assert torch.equal(chunks(x), linear(x))


PRETRAINER = '''
from libai.accelerate import PreTrainer
from libai.accelerate.data import pretraining_datasets
from libai.models import GPTForPreTraining
from libai.models.utils import load_huggingface


class GPTPreTrainer(PreTrainer):
    """Megatron's shape: datasets from the sample counts, (output, loss_func) forward."""

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        return pretraining_datasets(self.args, train_val_test_num_samples[:2])

    def model_optimizer_lr_scheduler_provider(self):
        path = self.args.pretrained_model_name_or_path
        return load_huggingface(path, GPTForPreTraining), None, None

    def run_forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output = model(input_ids=batch["input_ids"], labels=batch["labels"])

        def loss_func(out):
            return out["lm_loss"], {"lm loss": out["lm_loss"].detach()}

        return output, loss_func
'''


def test_the_pretrainer_template_reproduces_the_black_box(accelerate_files, tmp_path):
    f = accelerate_files
    steps = 5
    argv = task_argv(f, "pretraining", tmp_path / "box", steps=steps)
    assert cli.main(argv) == 0
    box = [read_metrics(tmp_path / "box")[i]["total_loss"] for i in range(steps)]
    script = tmp_path / "my_pretrainer.py"
    script.write_text(textwrap.dedent(PRETRAINER))
    argv = task_argv(f, "pretraining", tmp_path / "tpl", steps=steps)
    argv = argv[2:]  # no --task: the script says what to do
    assert cli.main([*argv, "--user-script", str(script)]) == 0
    template = [read_metrics(tmp_path / "tpl")[i]["total_loss"] for i in range(steps)]
    assert template == box
    # the black box wrote the zoo GPT back with the source checkpoint's special token ids
    config = json.loads((tmp_path / "box" / "hf" / "config.json").read_text())
    source = json.loads((f["gpt2"] / "config.json").read_text())
    assert config["eos_token_id"] == source["eos_token_id"]
