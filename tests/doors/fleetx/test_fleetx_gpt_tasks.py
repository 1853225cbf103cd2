"""FleetX's GPT task modules by their names, run from FleetX's own YAMLs (tests/fixtures/
fleetx, byte for byte) shrunk by ``-o``: GPTEvalModule's perplexity and LAMBADA accuracy
against transformers' GPT-2 with the same weights on the same tokens (LAMBADA through
tools/eval.py), and
GPTGenerationModule exported by tools/export.py, then generating from the exported graphs
as FleetX's inference YAML configures, token for token as the eager model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import make_engine, run_tool
from fleetx_files import (
    GPT_CONFIGS,
    TINY,
    fleetx_corpus,
    tiny_hf_gpt2,
    tokenizer_overrides,
)

from libai.data.datasets.fleetx_eval import wikitext_detokenize
from libai.fleetx.yaml_config import YAMLConfigError, load_yaml_config
from libai.fleetx.yaml_setup import resolve_module_class

WIKI = (
    " = Valkyria Chronicles = \n\n The quick brown fox @-@ jumps over the lazy dog . "
    "Hello world ! \n def hello ( world ) : return world + 1 \n"
) * 3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleetx_gpt")
    tok = tokenizer_overrides(root / "tok")
    hf = tiny_hf_gpt2(root / "hf")
    return {"root": root, "tok": tok, "hf": hf, "pretrained": f"+Model.pretrained={root / 'hf'}"}


def offline_eval(files, tmp_path, *overrides):
    cfg = load_yaml_config(
        GPT_CONFIGS / "eval_gpt_345M_single_card.yaml",
        [
            *TINY,
            *files["tok"],
            files["pretrained"],
            f"Engine.save_load.output_dir={tmp_path / 'out'}",
            *overrides,
        ],
    )
    engine = make_engine(cfg, mode="eval")
    return engine, engine.evaluate()


def hf_nll(model, tokens: list[int]) -> torch.Tensor:
    """Per-target NLL of ``tokens[1:]`` given the tokens before (one window)."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0]
    return F.cross_entropy(logits, torch.tensor(tokens[1:]), reduction="none")


@pytest.mark.parametrize("overlap", [16, 6])
def test_gpt_eval_module_perplexity_equals_transformers(files, tmp_path, overlap):
    path = tmp_path / "wiki.valid.tokens"
    path.write_text(WIKI)
    seq = 16
    engine, results = offline_eval(
        files,
        tmp_path,
        f"Offline_Eval.eval_path={path}",
        f"Offline_Eval.max_seq_len={seq}",
        f"Offline_Eval.overlapping_eval={overlap}",
        "Offline_Eval.batch_size=3",
    )
    # reference: every target of the token stream scored once by transformers' GPT-2, in
    # windows of seq tokens starting every `overlap` tokens (a later window scores only
    # the targets no earlier window scored)
    tokens = engine.tokenizer.encode(wikitext_detokenize(WIKI))
    total, scored, start = 0.0, 0, 0
    while scored < len(tokens) - 1:
        window = tokens[start : start + seq + 1]
        nll = hf_nll(files["hf"], window)
        first_new = scored - start  # targets before this one were scored already
        total += float(nll[first_new:].sum())
        scored = start + len(window) - 1
        start += overlap
    mean_nll = total / (len(tokens) - 1)
    assert results["avg_loss"] == pytest.approx(mean_nll, rel=1e-5)
    assert results["ppl"] == pytest.approx(math.exp(mean_nll), rel=1e-5)
    words = len(WIKI.strip().split(" "))
    ratio = (len(tokens) - 1) / (words - 1)
    assert results["token_ratio"] == pytest.approx(ratio)
    assert results["adjusted_ppl"] == pytest.approx(math.exp(mean_nll * ratio), rel=1e-4)


def lambada_lines(model, tokenizer, n: int = 8) -> tuple[list[str], int]:
    """LAMBADA-style lines; about half end with the word transformers' GPT-2 predicts after
    the context (a hit), the others with a word it does not. Returns (lines, hits)."""
    words = "the quick brown fox jumps over lazy dog hello world class def return print".split()
    gen = torch.Generator().manual_seed(0)
    lines, hits = [], 0
    for i in range(200):
        context = " ".join(words[int(j)] for j in torch.randint(0, len(words), (6,), generator=gen))
        ids = tokenizer.encode(context)
        with torch.no_grad():
            guess = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        text = tokenizer.decode([guess])
        clean = text.startswith(" ") and text[1:].isalpha() and tokenizer.encode(text) == [guess]
        if clean and hits < n // 2:
            lines.append(f"{context}{text}")
            hits += 1
        elif not clean and len(lines) - hits < n - n // 2:
            lines.append(f"{context} {words[i % len(words)]}")
        if len(lines) == n:
            break
    return lines, hits


def test_gpt_eval_module_lambada_accuracy_equals_transformers_greedy(files, tmp_path):
    from libai.fleetx.modules.gpt import _gpt2_tokenizer

    vocab = files["tok"][0].split("=", 1)[1]
    merges = files["tok"][1].split("=", 1)[1]
    tokenizer = _gpt2_tokenizer(vocab, merges)
    lines, _ = lambada_lines(files["hf"], tokenizer)
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    # reference: an example counts when transformers' greedy argmax gives every token of
    # its last word after the context
    correct = 0
    for text in lines:
        last = text.split()[-1]
        context = tokenizer.encode(text[: text.rfind(last)].strip())
        target = tokenizer.encode(" " + last)
        with torch.no_grad():
            logits = files["hf"](torch.tensor([context + target[:-1]])).logits[0]
        predicted = logits[len(context) - 1 :].argmax(-1).tolist()
        correct += predicted == target
    assert 0 < correct < len(lines)  # a reference with hits and misses
    proc = run_tool(  # as a FleetX user runs it
        "eval",
        GPT_CONFIGS / "eval_gpt_345M_single_card.yaml",
        *TINY,
        *files["tok"],
        files["pretrained"],
        f"Engine.save_load.output_dir={tmp_path / 'out'}",
        f"Offline_Eval.eval_path={path}",
        "Offline_Eval.cloze_eval=true",
        "Offline_Eval.max_seq_len=16",
        "Offline_Eval.batch_size=3",
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("eval "))
    results = dict(item.split("=") for item in line.split()[1:])
    assert float(results["num_examples"]) == len(lines)
    assert float(results["num_correct"]) == correct
    assert float(results["acc"]) == pytest.approx(correct / len(lines), rel=1e-5)


def test_generation_export_then_inference_from_fleetx_yamls(files, tmp_path, sample_env):
    """generation_gpt_345M_single_card.yaml through tools/export.py (FleetX's layout:
    output_dir/rank_0), then inference_gpt_345M_single_card.yaml reading Inference.model_dir:
    the exported graphs generate the eager model's tokens (FleetX's sampling, seeded)."""
    out = tmp_path / "output"
    data = fleetx_corpus(tmp_path / "data", num_docs=3000)
    sizes = [*TINY, *files["tok"], files["pretrained"], "Generation.max_dec_len=5"]
    run_tool(
        "export",
        GPT_CONFIGS / "generation_gpt_345M_single_card.yaml",
        *sizes,
        f"Engine.save_load.output_dir={out}",
        env=sample_env,
    )
    assert (out / "rank_0" / "model.onnx").is_file()
    assert (out / "rank_0" / "model_with_past.onnx").is_file()
    inference = [
        *sizes,
        f"Data.Test.dataset.input_dir={data}",
        "Data.Test.dataset.max_seq_len=8",
    ]
    yaml = GPT_CONFIGS / "inference_gpt_345M_single_card.yaml"
    deployed = make_engine(
        load_yaml_config(
            yaml, [*inference, f"Inference.model_dir={out}", f"Engine.save_load.output_dir={out}"]
        ),
        mode="inference",
    )
    batch = next(iter(deployed.test_loader))
    assert batch["input_ids"].shape == (2, 8) and not torch.equal(*batch["input_ids"])
    got = deployed.inference(batch)
    eager = make_engine(
        load_yaml_config(
            yaml,
            [*inference, "Inference.model_dir=null", f"Engine.save_load.output_dir={tmp_path}"],
        ),
        mode="inference",
    )
    expected = eager.inference(batch)
    assert torch.equal(torch.as_tensor(got["output_ids"]), expected["output_ids"])
    assert expected["output_ids"].shape == (2, 5)
    assert got["texts"] == expected["texts"]
    # the same graph as a plain predictor on a training-style batch (labels, no mask or
    # positions): the causal LM's attention_mask / position_ids are filled in
    from libai.fleetx.export import OnnxPredictor

    labelled = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
    logits = OnnxPredictor(str(out))(labelled)["logits"]
    with torch.no_grad():
        model = eager.runner.model.eval()
        reference = model(input_ids=batch["input_ids"])["logits"]
    torch.testing.assert_close(torch.from_numpy(logits), reference, atol=1e-5, rtol=1e-4)


def test_inference_longer_than_the_positions_is_one_line_naming_the_keys(files, tmp_path):
    """FleetX's shipped inference pair (Data.Test.dataset.max_seq_len 1024 + max_dec_len 200)
    on a model of fewer positions: one line naming the three keys, before any model is
    built; a prompt given directly is checked the same way before generation starts."""
    yaml = GPT_CONFIGS / "inference_gpt_345M_single_card.yaml"
    common = [*TINY, *files["tok"], files["pretrained"], f"Engine.save_load.output_dir={tmp_path}"]
    cfg = load_yaml_config(yaml, [*common, "Inference.model_dir=null"])
    with pytest.raises(ValueError) as err:
        make_engine(cfg, mode="inference")
    assert str(err.value) == (
        "Data.Test.dataset.max_seq_len (1024) + Generation.max_dec_len (200) = 1224 tokens, "
        "more than Model.max_position_embeddings (64): shorten the prompt or lower "
        "Generation.max_dec_len"
    )
    data = fleetx_corpus(tmp_path / "data", num_docs=300)
    fits = [
        "Inference.model_dir=null",
        f"Data.Test.dataset.input_dir={data}",
        "Data.Test.dataset.max_seq_len=8",
        "Data.Test.dataset.split=[1,1,8]",
        "Generation.max_dec_len=56",
    ]
    engine = make_engine(load_yaml_config(yaml, [*common, *fits]), mode="inference")
    with pytest.raises(
        ValueError,
        match=r"^the prompt length \(9\) \+ Generation.max_dec_len "
        r"\(56\) = 65 tokens, more than Model.max_position_embeddings \(64\)",
    ):
        engine.inference({"input_ids": torch.zeros(1, 9, dtype=torch.long)})
    assert (
        engine.inference({"input_ids": torch.zeros(1, 8, dtype=torch.long)})["output_ids"].shape[1]
        <= 56
    )


def test_gpt_eval_of_an_empty_file_scores_nothing(files, tmp_path):
    """WikiText perplexity of a file with no tokens: no targets, so the average loss, both
    perplexities and the token ratio are NaN (nothing to divide), not exp(20)."""
    path = tmp_path / "wiki.valid.tokens"
    path.write_text("")
    _, results = offline_eval(
        files, tmp_path, f"Offline_Eval.eval_path={path}", "Offline_Eval.max_seq_len=16"
    )
    for key in ("avg_loss", "ppl", "adjusted_ppl", "token_ratio"):
        assert math.isnan(results[key]), (key, results)


def test_gpt_eval_refuses_an_unknown_offline_eval_key(files, tmp_path):
    path = tmp_path / "wiki.valid.tokens"
    path.write_text(WIKI)
    with pytest.raises(ValueError, match=r"unknown config key Offline_Eval.eval_paht \(known: "):
        offline_eval(files, tmp_path, f"+Offline_Eval.eval_paht={path}")


def test_fleetx_module_names_without_implementation_are_named():
    with pytest.raises(YAMLConfigError, match=r"Model.module MOCOModule \(FleetX\) is not "):
        resolve_module_class("MOCOModule")
    for name in (
        "GPTModule",
        "GPTEvalModule",
        "GPTGenerationModule",
        "GPTFinetuneModule",
        "MoEModule",
    ):
        assert resolve_module_class(name).__name__ == name


SST2_ROWS = [
    ("hello world", 1),
    ("the quick brown fox", 0),
    ("def hello", 1),
    ("lazy dog jumps over", 0),
    ("print name", 1),
    ("class Greeter", 0),
    ("return world", 1),
]


def test_gpt_finetune_module_on_sst2_from_the_fleetx_yaml(files, tmp_path):
    """finetune_gpt_345M_single_card_glue.yaml (GPTFinetuneModule, SST2 from local files):
    before training, Engine.evaluate's loss and accuracy equal the formula on transformers'
    GPT-2 hidden states with the module's score head (cross entropy of the logits at each
    row's last real token); then one epoch trains through the Engine."""
    from fleetx_files import write_sst2

    sst = write_sst2(tmp_path / "SST-2", SST2_ROWS)
    cfg = load_yaml_config(
        GPT_CONFIGS / "finetune_gpt_345M_single_card_glue.yaml",
        [
            *TINY,
            *files["tok"],
            f"Model.pretrained={files['root'] / 'hf'}",
            "Global.local_batch_size=3",
            "Global.micro_batch_size=3",
            "Engine.num_train_epochs=1",
            "Engine.logging_freq=1",
            f"Engine.save_load.output_dir={tmp_path / 'out'}",
            *(f"Data.{s}.dataset.{k}" for s in ("Train", "Eval") for k in (f"root={sst}",)),
            *(f"Data.{s}.dataset.max_length=6" for s in ("Train", "Eval")),
            *(f"Data.{s}.loader.num_workers=0" for s in ("Train", "Eval")),
        ],
    )
    engine = make_engine(cfg)
    results = engine.evaluate()
    score = engine.module.model.score.weight.detach()
    tokenizer, pad = engine.tokenizer, engine.tokenizer.eos_token_id
    losses, correct = [], 0
    batches = [SST2_ROWS[i : i + 3] for i in range(0, len(SST2_ROWS), 3)]
    for rows in batches:
        ids = [tokenizer.encode(t)[:6] for t, _ in rows]
        padded = torch.tensor([x + [pad] * (6 - len(x)) for x in ids])
        with torch.no_grad():
            hidden = files["hf"].transformer(padded).last_hidden_state
        last = torch.tensor([len(x) - 1 for x in ids])
        logits = hidden[torch.arange(len(rows)), last] @ score.T
        labels = torch.tensor([y for _, y in rows])
        losses.append(float(F.cross_entropy(logits, labels)))
        correct += int((logits.argmax(-1) == labels).sum())
    assert results["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert results["acc"] == pytest.approx(correct / len(SST2_ROWS))
    # export inputs: token ids drawn from the checkpoint's whole vocabulary
    (spec,) = engine.module.input_spec()
    assert (spec.name, str(spec.dtype), spec.high) == ("input_ids", "int64", 512)
    assert files["hf"].config.vocab_size == 512
    engine.fit()
    assert engine.trainer.iter == len(SST2_ROWS) // 3  # one epoch of full batches
