"""Reference checks for libai.inference behaviour that the other tests left open:
GenerationConfig.validate's messages (key and rule), _check_prompt's shape check, the
default min_tokens_to_keep of top_p, the LiBai-style processor classes (kwargs through
LogitsProcessorList, top_p=0 accepted, cfg objects read through ``get``), the image
pipeline's default top_k, generation_config.json read by the text-generation pipeline, and
the tokenizers picked from vocab / merges / spiece files. Each is compared with
transformers on the same input or with a hand-derived value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from generation_helpers import train_spiece
from inference_helpers import CORPUS, assert_same_results, make_images, train_wordpiece_vocab

from libai.inference.generation import GenerationConfig, generate
from libai.inference.generation import logits_process as lp
from libai.inference.generator import Generator, LogitsProcessorList, TopPLogitsWarper
from libai.inference.tokenizer_loading import find_tokenizer_files, load_tokenizer

transformers.logging.set_verbosity_error()


# ---- GenerationConfig.validate: the message names the key and the rule ----------------------
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(top_k=-1), "top_k=-1: an integer >= 0 (0 = off)"),
        (dict(top_p=0.0), "top_p=0.0: must be in (0, 1]"),
        (dict(num_beams=0), "num_beams=0: >= 1"),
        (
            dict(cache_implementation="dynamic", max_cache_len=8),
            "max_cache_len=8: applies to cache_implementation='static' only",
        ),
        (
            dict(num_beams=2, do_sample=True),
            "do_sample=True: beam sampling is not supported; use num_beams=1",
        ),
        (dict(min_new_tokens=-1), "min_new_tokens=-1: >= 0"),
        (
            dict(do_sample=True, temperature=0.0),
            "temperature=0.0: must be > 0 (use do_sample=False for greedy)",
        ),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size=-1: >= 0"),
        (dict(early_stopping="sometimes"), "early_stopping='sometimes': True, False or 'never'"),
        (dict(num_beams=2, num_return_sequences=0), "num_return_sequences=0: >= 1"),
        (
            dict(cache_implementation="static", max_cache_len=0),
            "max_cache_len=0: an integer >= 1 (or None: prompt + max_new_tokens)",
        ),
        (
            dict(num_return_sequences=2),
            "num_return_sequences=2: greedy search returns one sequence; use do_sample=True "
            "or num_beams",
        ),
    ],
)
def test_validate_message_names_key_and_rule(settings, message):
    """The ValueError users see is ``<key>=<value>: <rule>`` with the rule of the class
    docstring (top_k 0 = off, top_p in (0, 1], num_beams >= 1, max_cache_len static only,
    no beam sampling): pinned against the hand-written text."""
    with pytest.raises(ValueError) as info:
        GenerationConfig().updated(**settings)
    assert str(info.value) == message


# ---- generate's prompt check -----------------------------------------------------------------
class _NeverCalled:
    is_encoder_decoder = False


def test_one_dimensional_prompt_rejected_with_shape_message():
    """A 1-D tensor of ids is not a [batch, seq] prompt: ValueError saying so (not an
    IndexError from deeper in)."""
    with pytest.raises(ValueError, match=r"input_ids must be a \[batch, seq\] tensor"):
        generate(_NeverCalled(), torch.tensor([1, 2, 3]))


# ---- top_p: default min_tokens_to_keep = 1, as transformers ----------------------------------
def test_top_p_default_keeps_one_token_like_transformers():
    """lp.top_p(p) with its default min_tokens_to_keep equals transformers'
    TopPLogitsWarper(p) (default 1): with a dominant token and a small p only that token
    survives."""
    scores = torch.tensor([[4.0, 0.0, -1.0, 0.5], [0.1, 0.2, 3.0, 0.0]])
    ids = torch.zeros(2, 1, dtype=torch.long)
    want = transformers.TopPLogitsWarper(0.3)(ids, scores)
    got = lp.top_p(0.3)(ids, scores)
    torch.testing.assert_close(got, want)
    assert int(torch.isfinite(got).sum(dim=-1).max()) == 1  # hand check: one token kept


def test_top_p_warper_accepts_zero_like_transformers():
    """TopPLogitsWarper's documented range is [0, 1] (transformers accepts 0.0 too): top_p=0
    keeps the single best token, as transformers' warper does."""
    scores = torch.randn(3, 11, generator=torch.Generator().manual_seed(3))
    ids = torch.zeros(3, 2, dtype=torch.long)
    want = transformers.TopPLogitsWarper(0.0)(ids, scores)
    torch.testing.assert_close(TopPLogitsWarper(0.0)(ids, scores), want)


# ---- LogitsProcessorList passes kwargs on, as transformers' ----------------------------------
class _AddBonus:
    """A processor with an extra keyword argument (transformers' kwargs protocol)."""

    def __call__(self, input_ids, scores, bonus):
        return scores + bonus


def test_processor_list_passes_kwargs_like_transformers():
    """``LogitsProcessorList(...)(ids, scores, bonus=...)`` gives each processor the scores
    and the kwargs: equal to transformers' LogitsProcessorList with the same processors."""
    scores = torch.randn(2, 7, generator=torch.Generator().manual_seed(4))
    ids = torch.zeros(2, 3, dtype=torch.long)
    want = transformers.LogitsProcessorList([_AddBonus(), _AddBonus()])(ids, scores, bonus=0.5)
    got = LogitsProcessorList([_AddBonus(), _AddBonus()])(ids, scores, bonus=0.5)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, scores + 1.0)


# ---- Generator: cfg read through .get --------------------------------------------------------
class _GetOnlyConfig:
    """A dict-like cfg that is not a Mapping and has no attributes, only ``get``."""

    def __init__(self, **values):
        self._values = values

    def get(self, name, default=None):
        return self._values.get(name, default)


class _CountingModel(torch.nn.Module, Generator):
    """Next token = last token + 1 (mod vocab), whatever the cache."""

    vocab = 16

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    def forward(self, input_ids, use_cache=None):
        nxt = (input_ids[:, -1] + 1) % self.vocab
        return {"logits": torch.nn.functional.one_hot(nxt, self.vocab).float()[:, None, :] * 10}


def test_generator_reads_defaults_from_get_only_cfg():
    """A cfg object with only ``get`` gives the defaults: max_length=7 counts the prompt of 2
    (5 new tokens), eos 6 ends the first row and pad 0 fills it. Hand-derived sequence."""
    model = _CountingModel(_GetOnlyConfig(max_length=7, eos_token_id=6, pad_token_id=0))
    got = model.generate(torch.tensor([[2, 3], [7, 8]]))
    want = torch.tensor([[2, 3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12, 13]])
    assert torch.equal(got, want), got


# ---- image classification: default top_k 5 ---------------------------------------------------
def test_image_classification_default_top_k_is_five_like_transformers(tmp_path, own_dist):
    """With 7 labels and no top_k, both our pipeline and transformers' return the 5 best
    labels (transformers' default top_k=5), same labels and scores."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    from libai.inference import ImageClassificationPipeline

    labels = {i: f"class_{i}" for i in range(7)}
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.3,
        num_labels=7,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    out = tmp_path / "vit7"
    transformers.ViTForImageClassification(config).save_pretrained(out)
    ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(out)
    images = make_images(2)
    theirs = transformers.pipeline(
        "image-classification",
        model=transformers.ViTForImageClassification.from_pretrained(out),
        image_processor=ViTImageProcessorPil.from_pretrained(out),
    )(images)
    ours = ImageClassificationPipeline(model_path=str(out), mode="huggingface")(images)
    assert [len(r) for r in theirs] == [5, 5]
    assert_same_results(ours, theirs, tol=1e-4)


# ---- text generation: generation_config.json next to the weights -----------------------------
def test_text_generation_defaults_from_generation_config_json(tmp_path, own_dist):
    """generation_config.json overrides config.json: the pipeline's defaults equal
    transformers.GenerationConfig.from_pretrained on the same directory."""
    from generation_helpers import make_gpt2_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = Path(make_gpt2_dir(tmp_path))
    settings = dict(
        max_new_tokens=3, top_k=7, top_p=0.8, repetition_penalty=1.3, num_beams=2, eos_token_id=5
    )
    (path / "generation_config.json").write_text(json.dumps(settings))
    want = transformers.GenerationConfig.from_pretrained(path)
    got = TextGenerationPipeline(model_path=str(path), mode="huggingface").generation_config
    for key in settings:
        assert getattr(got, key) == getattr(want, key), key


# ---- tokenizers picked from the files --------------------------------------------------------
SAMPLES = ["Hello World, the quick brown fox.", "paris is the capital of France"]


def test_gpt2_tokenizer_from_vocab_and_merges(tmp_path):
    """vocab.json + merges.txt: the merges are used; ids equal transformers' GPT2Tokenizer
    built from the same two files."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS, vocab_size=300, min_frequency=2, special_tokens=["<|endoftext|>"]
    )
    bpe.save_model(str(tmp_path))
    ours = load_tokenizer(find_tokenizer_files(tmp_path))
    theirs = transformers.GPT2Tokenizer.from_pretrained(tmp_path)  # the same two files
    for text in SAMPLES:
        assert ours.encode(text) == theirs.encode(text), text
    assert len(ours.encode("the quick brown fox")) < len("the quick brown fox")  # merged


@pytest.mark.parametrize("lower", [None, False, True], ids=["absent", "cased", "uncased"])
def test_bert_tokenizer_do_lower_case_from_config(tmp_path, lower):
    """vocab.txt: tokenizer_config.json's do_lower_case is honoured and, when absent,
    BERT's default (lower case) applies: tokens equal transformers' BertTokenizer with the
    same setting."""
    train_wordpiece_vocab(tmp_path)
    kwargs = {}
    if lower is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
        kwargs["do_lower_case"] = lower
    ours = load_tokenizer(find_tokenizer_files(tmp_path))
    theirs = transformers.BertTokenizer.from_pretrained(tmp_path, **kwargs)
    for text in SAMPLES:
        assert ours.tokenize(text) == theirs.tokenize(text), text
    cased = ours.tokenize("Hello")
    assert (cased == ["hello"]) == (lower is not False), cased


def test_t5_tokenizer_from_spiece(tmp_path):
    """spiece.model: tokens and ids equal transformers' T5Tokenizer of the same file."""
    train_spiece(tmp_path)
    ours = load_tokenizer(find_tokenizer_files(tmp_path))
    theirs = transformers.T5Tokenizer.from_pretrained(tmp_path)
    for text in SAMPLES:
        assert ours.tokenize(text) == theirs.tokenize(text), text
        assert ours.encode(text) == theirs.encode(text), text
