"""Reference checks for inference options a sample of mutants found untested: the tokenizer
files (RoBERTa's by ``model_type``, ``AddedToken`` dicts), the classification scores
(``top_k``'s checks, the default function, float32 as transformers), the LiBai-style top-p
warper's ``min_tokens_to_keep``, the pipelines' construction (positional arguments, the
model's image size, a missing checkpoint, parameters given at construction, a config file's
hyper-parameters over Hugging Face weights) and defaults (eos from the tokenizer, an
encoder-decoder's decoder start, the pad id of the prompts' left padding), and
``generate``'s checks and its missing mask. Each is compared with transformers on the same files / scores or with a
hand-derived value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from inference_helpers import CORPUS

from libai import dist
from libai.inference.classification_utils import apply_function, check_top_k, default_function
from libai.inference.generator import TopPLogitsWarper
from libai.inference.tokenizer_loading import (
    PretrainedJsonTokenizer,
    find_tokenizer_files,
    load_tokenizer,
)

transformers.logging.set_verbosity_error()

SAMPLES = ["Hello World, the quick brown fox.", "paris is the capital of France"]


ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<|endoftext|>"]


def test_roberta_tokenizer_from_vocab_and_merges_by_model_type(tmp_path):
    """vocab.json + merges.txt with ``model_type: roberta``: RoBERTa's tokenizer (``<s>`` …
    ``</s>`` around the ids with the special tokens), equal to transformers' RobertaTokenizer
    of the same files; the same files without the model type stay GPT-2's (no ``<s>``).
    ``load_tokenizer`` takes the directory's path as well as the files found in it."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS, vocab_size=300, min_frequency=2, special_tokens=ROBERTA_SPECIALS
    )
    bpe.save_model(str(tmp_path))
    ours = load_tokenizer(find_tokenizer_files(tmp_path, {"model_type": "roberta"}))
    theirs = transformers.RobertaTokenizer.from_pretrained(tmp_path)
    for text in SAMPLES:
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text), text
    by_path = load_tokenizer(str(tmp_path), {"model_type": "roberta"})  # the directory itself
    assert by_path.encode(SAMPLES[1], add_special_tokens=True) == theirs.encode(SAMPLES[1])
    plain = load_tokenizer(find_tokenizer_files(tmp_path, {"model_type": "gpt2"}))
    assert plain.encode(SAMPLES[0], add_special_tokens=True) == theirs.encode(SAMPLES[0])[1:-1]


def test_special_tokens_written_as_added_token_dicts(tmp_path):
    """``tokenizer_config.json`` may write a special token as an ``AddedToken`` dict
    (``{"content": "</s>", ...}``): its content is the token, as transformers reads it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>", "<pad>"])
    )
    tok.save(str(tmp_path / "tokenizer.json"))

    def added(content):
        return {
            "content": content,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": True,
            "__type": "AddedToken",
        }

    config = {"eos_token": added("</s>"), "pad_token": added("<pad>"), "unk_token": "<unk>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = PretrainedJsonTokenizer(str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (ours.eos_token, ours.pad_token, ours.unk_token) == ("</s>", "<pad>", "<unk>")
    assert (ours.eos_token, ours.pad_token) == (str(theirs.eos_token), str(theirs.pad_token))


@pytest.mark.parametrize("bad", [True, False, 0, -2, 2.0, "3"])
def test_top_k_must_be_a_positive_int(bad):
    """``top_k``: a positive int; bools, floats and strings are refused with the value named."""
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        check_top_k(bad, allow_none=True)


def test_top_k_none_only_where_it_means_all():
    """None means "all labels" only where allowed; a given top_k is kept either way."""
    assert check_top_k(None, allow_none=True) is None
    with pytest.raises(ValueError, match="top_k must be a positive integer, got None"):
        check_top_k(None)
    assert check_top_k(3, allow_none=True) == 3 and check_top_k(3) == 3


@pytest.mark.parametrize(
    "config, num_labels, formula",
    [
        ({}, 1, lambda x: 1 / (1 + np.exp(-x))),
        ({"problem_type": "multi_label_classification"}, 3, lambda x: 1 / (1 + np.exp(-x))),
        ({"problem_type": "regression"}, 3, lambda x: x),
        ({}, 3, lambda x: np.exp(x) / np.exp(x).sum()),
    ],
)
def test_default_scores_follow_transformers_rule(config, num_labels, formula):
    """The default score function (transformers' rule: none for regression, sigmoid for
    multi-label or a single label, softmax otherwise) applied to a row of logits gives the
    formula's scores."""
    logits = np.linspace(-2.0, 1.5, num_labels).astype(np.float32)
    got = apply_function(logits, default_function(config, num_labels))
    np.testing.assert_allclose(got, formula(logits.astype(np.float64)), rtol=1e-6)


def test_top_p_warper_min_tokens_to_keep_like_transformers():
    """``TopPLogitsWarper(p, min_tokens_to_keep=3)``: at least 3 tokens survive a small p,
    the scores of transformers' warper with the same arguments."""
    scores = torch.randn(4, 13, generator=torch.Generator().manual_seed(6)) * 4
    ids = torch.zeros(4, 2, dtype=torch.long)
    want = transformers.TopPLogitsWarper(0.05, min_tokens_to_keep=3)(ids, scores)
    got = TopPLogitsWarper(0.05, min_tokens_to_keep=3)(ids, scores)
    torch.testing.assert_close(got, want)
    assert int(torch.isfinite(got).sum(-1).min()) == 3


@pytest.mark.parametrize("name", ["softmax", "sigmoid"])
def test_scores_are_transformers_float32_scores_bit_for_bit(name):
    """Scores are computed in float32 as transformers' classification pipelines compute them:
    from float64 logits (a caller's numpy array) the scores equal, bit for bit, transformers'
    ``softmax`` / ``sigmoid`` of the float32 logits."""
    from transformers.pipelines import text_classification as reference

    logits = np.linspace(-2.0, 1.5, 7)  # float64
    want = getattr(reference, name)(logits.astype(np.float32))
    got = apply_function(logits, name)
    assert got.dtype == np.float32 and np.array_equal(got, want), (got, want)


def test_image_pipeline_positional_arguments_and_the_model_image_size(tmp_path, own_dist):
    """The image pipeline takes BasePipeline's arguments positionally, and without a
    ``preprocessor_config.json`` it resizes to the model's ``image_size`` (16 here, not the
    224 default): labels and scores equal transformers' pipeline with a ViT image processor
    of that size (default mean and std)."""
    from inference_helpers import assert_same_results, make_images, make_vit_dir
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    from libai.inference import ImageClassificationPipeline

    out = Path(make_vit_dir(tmp_path))
    (out / "preprocessor_config.json").unlink()
    images = make_images(2)
    theirs = transformers.pipeline(
        "image-classification",
        model=transformers.ViTForImageClassification.from_pretrained(out),
        image_processor=ViTImageProcessorPil(size={"height": 16, "width": 16}),
    )(images)
    ours = ImageClassificationPipeline(None, 1, 1, 1, None, None, str(out), "huggingface")
    assert_same_results(ours(images), theirs, tol=1e-4)


def test_libai_mode_missing_checkpoint_named_before_any_model(tmp_path, own_dist):
    """mode='libai' with a checkpoint directory that does not exist: FileNotFoundError naming
    it, raised before the model is built or the mesh set up (the model in the config is
    too large to build here)."""
    from libai.inference import TextGenerationPipeline

    config = tmp_path / "model.py"
    config.write_text(
        "from libai.config import LazyCall\n"
        "from libai.models import GPTForPreTraining\n"
        "model = LazyCall(GPTForPreTraining)(cfg=dict(hidden_size=1 << 40))\n"
    )
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(FileNotFoundError, match=f"model_path {missing} does not exist"):
        TextGenerationPipeline(str(config), model_path=str(missing), mode="libai")


def test_max_new_tokens_message_names_the_rule():
    """A negative ``max_new_tokens``: ValueError naming the key, the value and the rule."""
    from libai.inference.generation import GenerationConfig

    with pytest.raises(ValueError, match="max_new_tokens=-1: >= 0"):
        GenerationConfig(max_new_tokens=-1).validate()


def test_generate_without_attention_mask_attends_to_every_token(tmp_path):
    """No ``attention_mask``: every prompt token counts, the tokens of transformers' greedy
    decoding with an all-ones mask."""
    from generation_helpers import load_tiny_gpt2, random_prompts

    from libai.inference.generation import generate

    dist.setup_dist_util()
    try:
        gpt2 = load_tiny_gpt2(tmp_path)
        ids = random_prompts(gpt2.hf.config.vocab_size, 8)
        want = gpt2.hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=4,
            eos_token_id=None,
        )
        got = generate(gpt2.stepper, ids, max_new_tokens=4, eos_token_id=None)
        assert torch.equal(got, want), (got, want)
    finally:
        dist.reset_dist_util()


# ---- text generation: defaults and parameters given at construction ---------------------------
def set_in_model_files(path: Path, **values) -> None:
    """``values`` written into config.json and generation_config.json (which wins where it
    exists: ``save_pretrained`` writes both)."""
    for name in ("config.json", "generation_config.json"):
        if (path / name).exists():
            config = json.loads((path / name).read_text())
            config.update(values)
            (path / name).write_text(json.dumps(config))


def test_eos_from_the_tokenizer_when_the_config_has_none(tmp_path, own_dist):
    """No eos id in config.json or generation_config.json: the pipeline's default eos is the
    tokenizer's (the id of ``<|endoftext|>`` in the tokenizer transformers loads from the
    same directory)."""
    from generation_helpers import make_gpt2_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = Path(make_gpt2_dir(tmp_path))
    set_in_model_files(path, eos_token_id=None, bos_token_id=None)
    want = transformers.AutoTokenizer.from_pretrained(path).eos_token_id
    pipe = TextGenerationPipeline(model_path=str(path), mode="huggingface")
    assert want is not None and pipe.generation_config.eos_token_id == want


def test_t5_decoder_start_from_the_config(tmp_path, own_dist):
    """An encoder-decoder's ``decoder_start_token_id`` from the directory is kept (pad only
    fills it in when absent): equal to transformers' GenerationConfig of the directory."""
    from generation_helpers import make_t5_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = Path(make_t5_dir(tmp_path))
    set_in_model_files(path, decoder_start_token_id=3)
    want = transformers.GenerationConfig.from_pretrained(path).decoder_start_token_id
    pipe = TextGenerationPipeline(model_path=str(path), mode="huggingface")
    assert want == 3 and pipe.generation_config.decoder_start_token_id == want


def test_return_full_text_given_at_construction(tmp_path, own_dist):
    """``return_full_text=False`` given to the constructor is the call's default: the text
    returned is the generated part only (hand-derived: the full text less the prompt)."""
    from generation_helpers import make_gpt2_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = make_gpt2_dir(tmp_path)
    prompt = "the quick brown fox"
    pipe = TextGenerationPipeline(model_path=path, mode="huggingface", return_full_text=False)
    new = pipe(prompt, max_new_tokens=4)[0]["generated_text"]
    full = pipe(prompt, max_new_tokens=4, return_full_text=True)[0]["generated_text"]
    assert full.startswith(prompt) and new == full[len(prompt) :], (new, full)


GPT_CONFIG_WITH_EXTRAS = """
from libai.config import LazyCall
from libai.models import GPTForPreTraining

model = LazyCall(GPTForPreTraining)(cfg=dict(loss_chunk_size=8))
"""


def test_config_file_sets_extra_hyperparameters_in_huggingface_mode(tmp_path, own_dist):
    """``mode="huggingface"`` with a ``config_file``: the model of the Hugging Face weights
    takes the config's ``model.cfg`` hyper-parameters that ``config.json`` has no key for
    (``loss_chunk_size``; without the config it is the class default, ``None``), and
    generates what the same weights generate without it."""
    from generation_helpers import make_gpt2_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = make_gpt2_dir(tmp_path)
    config = tmp_path / "gpt_extras.py"
    config.write_text(GPT_CONFIG_WITH_EXTRAS)
    plain = TextGenerationPipeline(model_path=path, mode="huggingface")
    want = plain("the quick brown fox", max_new_tokens=4)
    dist.reset_dist_util()
    pipe = TextGenerationPipeline(str(config), model_path=path, mode="huggingface")
    assert plain.model.GPT_model.loss_chunk_size is None
    assert pipe.model.GPT_model.loss_chunk_size == 8
    assert pipe("the quick brown fox", max_new_tokens=4) == want


def test_prompts_left_padded_with_the_pad_id_as_transformers(tmp_path, own_dist):
    """Prompts of different lengths are left-padded with the directory's pad id (here 5,
    not 0): ids and mask equal transformers' tokenizer of the same directory padding on the
    left with that pad token."""
    from generation_helpers import PROMPTS, make_gpt2_dir

    from libai.inference.text_generation import TextGenerationPipeline

    path = Path(make_gpt2_dir(tmp_path))
    set_in_model_files(path, pad_token_id=5)
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    theirs.pad_token, theirs.padding_side = theirs.convert_ids_to_tokens(5), "left"
    want = theirs(PROMPTS, padding=True, return_tensors="pt")
    pipe = TextGenerationPipeline(model_path=str(path), mode="huggingface")
    got = pipe.encode_prompts(PROMPTS, add_special_tokens=True)
    assert bool((want["input_ids"] == 5).any())  # the batch is padded
    assert torch.equal(got["input_ids"], want["input_ids"])
    assert torch.equal(got["attention_mask"], want["attention_mask"])
