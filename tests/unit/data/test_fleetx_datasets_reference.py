"""FleetX's dataset classes re-implemented in libai.data.datasets.fleetx_* (image
classification list, ERNIE pretraining data, the LAMBADA / WikiText evaluation sets, the GPT
corpus files), each checked against a reference written out here: windows, masks and
masked positions worked out by hand from FleetX's rules on tiny hand-made inputs, PIL /
numpy for the image ops, and FleetX's own functions (tests/fixtures/fleetx) where they are
plain Python."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fleetx_reference import GPT_DATASET, fleetx_function, write_fleetx_corpus
from PIL import Image

from libai.data.datasets import fleetx_cls, fleetx_ernie, fleetx_eval, fleetx_gpt

IGNORE = -100


# ---- image classification (GeneralClsDataset, transform_ops) -----------------------------------
def _png(path, array: np.ndarray) -> None:
    Image.fromarray(array.astype(np.uint8), "RGB").save(path)


def test_scale_reads_fleetx_fraction_strings():
    """``NormalizeImage.scale`` is ``1.0/255.0`` (a string) in FleetX's files: the fraction's
    value; plain numbers and a string without ``/`` as themselves."""
    assert fleetx_cls._scale("1.0/255.0") == pytest.approx(1.0 / 255.0)
    assert fleetx_cls._scale("2/8") == 0.25
    assert fleetx_cls._scale("3") == 3.0 and fleetx_cls._scale(0.5) == 0.5


def test_transform_ops_apply_their_args_like_pil_and_numpy():
    """Each ``{OpName: args}`` entry is built with its args: ResizeImage(resize_short) sets
    the shorter side with PIL's bilinear resize, CenterCropImage cuts the middle,
    NormalizeImage computes ``(pixel x scale - mean) / std`` with the given mean / std,
    ToCHWImage transposes HWC -> CHW (all compared with PIL / numpy written here)."""
    g = np.random.RandomState(0)
    image = Image.fromarray(g.randint(0, 256, (6, 8, 3)).astype(np.uint8), "RGB")  # w 8, h 6
    mean, std = [0.1, 0.2, 0.3], [0.5, 0.25, 2.0]
    ops = fleetx_cls.build_transform_ops(
        [
            {"ResizeImage": {"resize_short": 3, "interpolation": "bilinear"}},
            {"CenterCropImage": {"size": 2}},
            {"NormalizeImage": {"scale": "1.0/255.0", "mean": mean, "std": std, "order": ""}},
            {"ToCHWImage": None},
        ]
    )
    out = image
    for op in ops:
        out = op(out, np.random.default_rng(0))
    resized = np.asarray(image.resize((4, 3), Image.Resampling.BILINEAR), np.float32)
    crop = resized[0:2, 1:3]  # 3 x 4 -> the centred 2 x 2 (top round((3-2)/2) = 0, left 1)
    expected = ((crop / 255.0 - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
    assert out.shape == (3, 2, 2) and out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="each entry is one"):
        fleetx_cls.build_transform_ops([{"ToCHWImage": None, "CenterCropImage": {}}])


def test_rand_crop_without_interpolation_is_bilinear():
    """RandCropImage with ``interpolation: null`` resizes bilinearly (FleetX's default); a
    full-area square crop of a square image is PIL's bilinear resize of the whole image."""
    g = np.random.RandomState(1)
    image = Image.fromarray(g.randint(0, 256, (8, 8, 3)).astype(np.uint8), "RGB")
    (op,) = fleetx_cls.build_transform_ops(
        [
            {
                "RandCropImage": {
                    "size": 4,
                    "scale": [1.0, 1.0],
                    "ratio": [1.0, 1.0],
                    "interpolation": None,
                }
            }
        ]
    )
    out = op(image, np.random.default_rng(3))
    ref = image.resize((4, 4), Image.Resampling.BILINEAR)
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_general_cls_dataset_samples(tmp_path):
    """GeneralClsDataset reads ``<path> <label>`` lines; a sample is ``{"images": float32
    CHW, "labels": the int label}`` with the decode op added first; pixels as numpy's
    ``(x/255 - mean) / std`` of the PNG written here."""
    g = np.random.RandomState(2)
    arrays = [g.randint(0, 256, (4, 5, 3)) for _ in range(2)]
    for i, array in enumerate(arrays):
        _png(tmp_path / f"img{i}.png", array)
    (tmp_path / "train.txt").write_text("img0.png 3\nimg1.png 1\n\n")
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.3, 0.4]
    data = fleetx_cls.GeneralClsDataset(
        image_root=str(tmp_path),
        cls_label_path=str(tmp_path / "train.txt"),
        transform_ops=[
            {"NormalizeImage": {"scale": 1.0 / 255.0, "mean": mean, "std": std}},
            {"ToCHWImage": None},
        ],
    )
    assert len(data) == 2
    for i, label in enumerate([3, 1]):
        sample = data[i]
        assert set(sample) == {"images", "labels"} and sample["labels"] == label
        ref = (arrays[i].astype(np.float32) / 255.0 - np.float32(mean)) / np.float32(std)
        assert sample["images"].dtype == torch.float32 and sample["images"].shape == (3, 4, 5)
        np.testing.assert_allclose(sample["images"].numpy(), ref.transpose(2, 0, 1), atol=1e-6)


# ---- ERNIE ----------------------------------------------------------------------------------------
def test_fleetx_split_bounds_equal_fleetx():
    """Document bounds of the Train / Eval / Test splits: by hand (round each share, the
    rounding error taken off every bound after the first) and FleetX's
    get_train_valid_test_split_."""
    fleetx = fleetx_function(GPT_DATASET, None, "get_train_valid_test_split_")
    assert fleetx_ernie.fleetx_split_bounds([949, 50, 1], 40) == [0, 38, 40, 40]
    # 10 / 3 = 3.33 -> 3 each, 9 in all: every bound after 0 moves by one
    assert fleetx_ernie.fleetx_split_bounds([1, 1, 1], 10) == [0, 4, 7, 10]
    for split, size in (([1, 1, 1], 10), ([6, 3, 1], 17), ([2, 1], 5), ([0, 5, 5], 9)):
        assert fleetx_ernie.fleetx_split_bounds(split, size) == fleetx(list(split), size)


class ScriptedRng:
    """Stands in for the generator: the word order, the n-gram sizes and the 80/10/10
    draws are given; records the n-gram probabilities it was asked with."""

    def __init__(self, order, ngrams, draws=None, random_ids=()):
        self.order, self.ngrams = list(order), list(ngrams)
        self.draws, self.random_ids = draws, list(random_ids)
        self.probs: list[list[float]] = []
        self.vocab = None

    def permutation(self, n):
        assert n == len(self.order)
        return np.asarray(self.order)

    def choice(self, sizes, p):
        assert list(sizes) == list(range(1, len(p) + 1))  # n-grams of 1 .. longest words
        self.probs.append(list(p))
        return self.ngrams.pop(0) if self.ngrams else 1

    def random(self, k):
        return np.full(k, 0.5) if self.draws is None else np.asarray(self.draws[:k])

    def integers(self, low, high, size):
        assert low == 0
        self.vocab = high
        return np.asarray(self.random_ids[:size], dtype=np.int64)


MASK = 4


def _mask(tokens, candidates, continuation, prob, max_ngrams, favor, rng, vocab=64):
    return fleetx_ernie.whole_word_ngram_mask(
        np.asarray(tokens), np.asarray(candidates), continuation, prob, max_ngrams, favor,
        MASK, vocab, rng,
    )  # fmt: skip


def _expected(tokens, masked, replaced=None):
    ids = np.asarray(tokens).copy()
    labels = np.full(len(tokens), IGNORE)
    for i in masked:
        labels[i] = tokens[i]
        ids[i] = MASK
    for i, value in (replaced or {}).items():
        ids[i] = value
    return ids, labels


def test_ngram_that_fills_the_budget_exactly_is_kept():
    """Budget round(10 x 0.2) = 2 tokens; the first word drawn (word 2, at position 3) with
    a 2-gram covers positions 3, 4: exactly the budget, so it is masked whole (FleetX only
    shortens a span that would exceed it) and masking stops there."""
    tokens = [2, 10, 11, 12, 13, 14, 15, 16, 17, 3]
    candidates = [False] + [True] * 8 + [False]
    continuation = np.zeros(64, dtype=bool)
    rng = ScriptedRng(order=[2, 5, 0, 1, 3, 4, 6, 7], ngrams=[2, 1, 1])
    ids, labels = _mask(tokens, candidates, continuation, 0.2, 3, False, rng)
    ref_ids, ref_labels = _expected(tokens, [3, 4])
    assert np.array_equal(labels, ref_labels) and np.array_equal(ids, ref_ids)
    # n drawn with probability proportional to 1/n: 1, 1/2, 1/3 over 3 sizes
    np.testing.assert_allclose(rng.probs[0], np.array([1, 1 / 2, 1 / 3]) / (11 / 6))


def test_whole_words_over_the_budget_are_skipped_and_80_10_10():
    """A 3-token word (a piece and two ``##`` pieces, positions 2-4) would take 3 of the 2
    budget tokens: skipped, not cut; the next words 0 and 2 (positions 1 and 5) are masked.
    The draws 0.5 / 0.95 give [MASK] / a random id (from [0, vocab_size)); with
    favor_longer_ngram the n-gram probabilities are reversed (1/3, 1/2, 1)."""
    tokens = [2, 10, 11, 40, 41, 14, 15, 16, 17, 3]
    candidates = [False] + [True] * 8 + [False]
    continuation = np.zeros(64, dtype=bool)
    continuation[40:] = True
    # words: [1], [2, 3, 4], [5], [6], [7], [8]
    rng = ScriptedRng(order=[1, 0, 2, 3, 4, 5], ngrams=[1, 1, 1], draws=[0.5, 0.95],
                      random_ids=[33])  # fmt: skip
    ids, labels = _mask(tokens, candidates, continuation, 0.2, 3, True, rng, vocab=64)
    ref_ids, ref_labels = _expected(tokens, [1], replaced={5: 33})
    ref_labels[5] = tokens[5]
    assert np.array_equal(labels, ref_labels) and np.array_equal(ids, ref_ids)
    assert rng.vocab == 64
    np.testing.assert_allclose(rng.probs[0], np.array([1 / 3, 1 / 2, 1]) / (11 / 6))


def test_ngram_masking_rules_with_a_real_generator():
    """Over 60 seeds: never more than round(0.15 x tokens) tokens, whole words only, labels
    the original tokens, the rest of the input untouched (FleetX's rules)."""
    continuation = np.zeros(64, dtype=bool)
    continuation[40:] = True
    g = np.random.RandomState(0)
    tokens = g.randint(5, 40, 40)
    pieces = g.rand(40) < 0.4
    tokens[pieces] = g.randint(40, 64, pieces.sum())
    tokens[0] = 7
    candidates = np.ones(40, dtype=bool)
    candidates[[0, 20]] = False
    word_of = np.cumsum(~continuation[tokens] | ~candidates | ~np.roll(candidates, 1))
    budget = round(40 * 0.15)
    for seed in range(60):
        rng = np.random.default_rng(seed)
        ids, labels = _mask(tokens, candidates, continuation, 0.15, 3, seed % 2 == 1, rng)
        masked = labels != IGNORE
        assert 1 <= masked.sum() <= budget and not masked[~candidates].any()
        assert (labels[masked] == tokens[masked]).all() and (ids[~masked] == tokens[~masked]).all()
        for w in np.unique(word_of[masked]):
            assert masked[(word_of == w) & candidates].all()


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]


@pytest.fixture(scope="module")
def ernie_corpus(tmp_path_factory):
    """FleetX's ERNIE corpus: ``_ids.npy``, ``_idx.npz`` with ``lens`` per sentence and
    ``docs`` (first sentence of each document, then the total), and a 64-id vocab.txt."""
    root = tmp_path_factory.mktemp("ernie")
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    rng = np.random.RandomState(0)
    documents = [
        [rng.randint(5, 64, rng.randint(3, 9)) for _ in range(rng.randint(2, 5))] for _ in range(12)
    ]
    sentences = [s for doc in documents for s in doc]
    (root / "data").mkdir()
    np.save(root / "data" / "corpus_ids.npy", np.concatenate(sentences).astype(np.int32))
    np.savez(
        root / "data" / "corpus_idx.npz",
        lens=np.asarray([len(s) for s in sentences], np.int32),
        docs=np.cumsum([0] + [len(doc) for doc in documents]).astype(np.int64),
    )
    return root, documents


def test_ernie_dataset_pairs_and_masks_from_the_corpus(ernie_corpus):
    """ErnieDataset over FleetX's corpus: Train holds documents 0..9 of 12 (split [8, 1, 1]:
    round(9.6) = 10), each sample is [CLS] A [SEP] B [SEP] from one document (B after A, or
    swapped with ns_labels 1) once the masked tokens are put back; at most round(0.15 x
    tokens) masked; replaced tokens are [MASK] or ids below vocab_size (64), and some are
    random replacements (neither [MASK] nor the original)."""
    from libai.fleetx.modules.ernie import ernie_tokenizer

    root, documents = ernie_corpus
    data = fleetx_ernie.ErnieDataset(
        str(root / "data"), split=[8, 1, 1], mode="Train", max_seq_length=48,
        masked_lm_prob=0.15, short_seq_prob=0.0, seed=7,
        tokenizer=ernie_tokenizer(root / "vocab.txt"),
    )  # fmt: skip
    assert data.documents.tolist() == list(range(10))
    whole = {tuple(np.concatenate(doc)): i for i, doc in enumerate(documents)}
    seen, random_replaced = set(), 0
    for epoch_pass in range(3):
        for i in range(len(data)):
            sample = data[(i + epoch_pass * len(data)) % len(data)]
            ids, labels = sample["input_ids"], sample["lm_labels"]
            n = int(sample["attention_mask"].sum())
            masked = labels != IGNORE
            assert 1 <= masked.sum() <= max(1, round(n * 0.15)) and not masked[n:].any()
            restored = torch.where(masked, labels, ids)[:n]
            seps = (restored == 3).nonzero().flatten().tolist()
            assert restored[0] == 2 and len(seps) == 2 and seps[1] == n - 1
            a, b = restored[1 : seps[0]].tolist(), restored[seps[0] + 1 : n - 1].tolist()
            seen.add(whole[tuple(a + b if sample["ns_labels"] == 0 else b + a)])
            assert (ids[masked] < 64).all() and (ids[masked] >= 0).all()
            random_replaced += int(((ids != MASK) & (ids != labels) & masked).sum())
    assert seen == set(range(10)) and random_replaced > 0


# ---- LAMBADA / WikiText evaluation sets -----------------------------------------------------------
class CharTokenizer:
    """One id per character (its code point); eos 0."""

    eos_token_id = 0

    def encode(self, text):
        return [ord(c) for c in text]


def _ords(text):
    return torch.tensor([ord(c) for c in text], dtype=torch.long)


def test_wikitext_detokenize_by_hand_and_as_fleetx():
    """WikiText's spacing undone: headings, number separators, punctuation, brackets and
    contractions, as written out by hand and as FleetX's _wikitext_detokenizer does it."""
    text = " = = Title = = \n The cat 's toy ( red ) , 1 @,@ 000 @-@ odd . \n"
    expected = " == Title ==\nThe cat's toy (red), 1,000-odd.\n"
    assert fleetx_eval.wikitext_detokenize(text) == expected
    fleetx = fleetx_function(GPT_DATASET, "LM_Eval_Dataset", "_wikitext_detokenizer")
    samples = [text, 'He said " hi there " [ 1 ] { x } . \n', "= = = = A = = = = 5 ° C"]
    for sample in samples:
        assert fleetx_eval.wikitext_detokenize(sample) == fleetx(None, sample)


def _write(path, text):
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def test_lm_eval_overlapping_windows(tmp_path):
    """ "abc de fgh" (10 tokens), max_seq_len 4, overlapping_eval 2: FleetX's count
    ceil((9 - 2) / 2) + 1 = 5 windows of 5 tokens starting every 2; window 0 scores all its
    targets, later ones their last 2 (padding, eos 0, never): each of the 9 targets once.
    info = [3 words, 10 tokens]."""
    text = "abc de fgh"
    data = fleetx_eval.LMEvalDataset(_write(tmp_path / "wiki.txt", text), 4, 2, CharTokenizer())
    pad = "\0"
    windows = [  # (inputs, labels, loss_mask) by hand
        (text[0:4], text[1:5], [1, 1, 1, 1]),
        (text[2:6], text[3:7], [0, 0, 1, 1]),
        (text[4:8], text[5:9], [0, 0, 1, 1]),
        (text[6:10], text[7:10] + pad, [0, 0, 1, 0]),
        (text[8:10] + pad * 2, text[9] + pad * 3, [0, 0, 0, 0]),
    ]
    assert len(data) == len(windows)
    scored = []
    for idx, (inputs, labels, mask) in enumerate(windows):
        sample = data[idx]
        assert torch.equal(sample["input_ids"], _ords(inputs)), idx
        assert torch.equal(sample["labels"], _ords(labels)), idx
        assert torch.equal(sample["position_ids"], torch.arange(4))
        assert sample["loss_mask"].tolist() == mask, idx
        assert sample["info"].tolist() == [3, 10] and sample["info"].dtype == torch.long
        scored += [2 * idx + 1 + j for j in range(4) if mask[j]]
    assert sorted(scored) == list(range(1, 10))


def test_lm_eval_default_stride_is_the_window(tmp_path):
    """Without overlapping_eval the windows do not overlap: ceil((9 - 4) / 4) + 1 = 3,
    starting at 0, 4, 8, every real target scored."""
    text = "abc de fgh"
    data = fleetx_eval.LMEvalDataset(_write(tmp_path / "wiki.txt", text), 4, None, CharTokenizer())
    assert len(data) == 3
    last = data[2]
    assert torch.equal(last["input_ids"], _ords("gh\0\0"))
    assert torch.equal(last["labels"], _ords("h\0\0\0"))
    assert last["loss_mask"].tolist() == [1, 0, 0, 0]
    assert data[1]["loss_mask"].tolist() == [1, 1, 1, 1]
    assert torch.equal(data[1]["input_ids"], _ords(text[4:8]))


def test_lambada_context_target_and_mask(tmp_path):
    """LAMBADA: context = the text before its last word, target = the tokens of " " + last
    word; loss_mask on the positions whose next token is the target; a context too long
    for the window keeps its last tokens; info = [number of examples]."""
    lines = [{"text": "the cat sat on the mat"}, {"text": "a b"}]
    path = tmp_path / "lambada.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    data = fleetx_eval.LambadaEvalDataset(str(path), 30, CharTokenizer())
    assert len(data) == 2
    sample = data[0]
    tokens = "the cat sat on the" + " mat" + "\0" * 9  # 22 tokens + padding to 31
    assert torch.equal(sample["input_ids"], _ords(tokens[:30]))
    assert torch.equal(sample["labels"], _ords(tokens[1:]))
    mask = [0.0] * 30
    mask[17:21] = [1.0] * 4  # labels 17..20 are " mat"
    assert sample["loss_mask"].tolist() == mask and sample["info"].tolist() == [2]
    short = fleetx_eval.LambadaEvalDataset(str(path), 8, CharTokenizer())[0]
    assert torch.equal(short["input_ids"], _ords("n the ma"))  # last 5 context tokens
    assert torch.equal(short["labels"], _ords(" the mat"))
    assert short["loss_mask"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


# ---- GPT corpus files and batches -----------------------------------------------------------------
def test_fold_loss_mask_sets_ignored_labels():
    """Labels where loss_mask is 0 become ignore_index, loss_mask is dropped, the caller's
    batch is left as it was; batches without a mask come back as they are."""
    labels = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long), "labels": labels, "loss_mask": mask}
    out = fleetx_gpt.fold_loss_mask(batch, ignore_index=-7)
    assert set(out) == {"input_ids", "labels"} and "loss_mask" in batch
    assert out["labels"].tolist() == [[5, -7, 7], [-7, 9, 10]]
    assert labels.tolist() == [[5, 6, 7], [8, 9, 10]]
    plain = {"input_ids": labels}
    assert fleetx_gpt.fold_loss_mask(plain) is plain


def test_token_file_prefers_the_npy_pair_over_the_legacy_npz(tmp_path):
    """With both layouts under one prefix, the ``_ids.npy`` + ``_idx.npz`` pair is read (as
    FleetX's get_train_data_file looks for ``_idx.npz`` first); the older ``_ids.npz``
    alone is read when the pair is absent."""
    prefix = str(tmp_path / "corpus")
    write_fleetx_corpus(prefix, [[1, 2, 3], [4, 5]])
    np.savez(prefix + "_ids.npz", ids=np.asarray([9, 8, 7, 6], np.int32), lens=np.asarray([1, 3]))
    data = fleetx_gpt.FleetXTokenFile(prefix)
    assert data.sizes.tolist() == [3, 2] and data.get(1).tolist() == [4, 5]
    legacy = str(tmp_path / "old")
    np.savez(legacy + "_ids.npz", ids=np.asarray([9, 8, 7, 6], np.int32), lens=np.asarray([1, 3]))
    assert fleetx_gpt.FleetXTokenFile(legacy).get(1).tolist() == [8, 7, 6]
