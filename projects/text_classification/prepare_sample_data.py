"""Write the project's sample data: short movie-review sentences labelled ``negative``,
``neutral`` or ``positive``, and a WordPiece ``vocab.txt`` that covers them.

    python projects/text_classification/prepare_sample_data.py [--out-dir DIR]

The files are shipped in ``projects/text_classification/sample_data/`` (this script wrote
them), so ``configs/config.py`` runs out of the box; run it to rebuild them, or as a model
of how to lay out your own CSV: a header row, one text column (two for sentence pairs) and
a label column. Everything is generated from fixed word lists with a fixed seed, offline.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import string

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample_data")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

SUBJECTS = [
    "the movie", "this film", "the plot", "the acting", "the soundtrack", "the ending",
    "the cast", "the story", "the dialogue", "the camera work", "the script", "the pacing",
]  # fmt: skip
VERBS = ["was", "felt", "seemed", "looked", "sounded", "is"]
ADVERBS = ["", "really", "quite", "rather", "truly", "mostly", "very"]
ENDINGS = [
    "", "to me", "overall", "at times", "in the end", "from start to finish",
    "for most of the film", "if you ask me", "on the whole",
]  # fmt: skip
#: the word that decides the label
ADJECTIVES = {
    "positive": ["great", "wonderful", "brilliant", "moving", "delightful", "superb", "charming"],
    "negative": ["awful", "boring", "dull", "terrible", "clumsy", "tedious", "painful"],
    "neutral": ["ordinary", "average", "acceptable", "standard", "typical", "passable"],
}


def review(rng: random.Random, label: str) -> str:
    """One sentence whose adjective says ``label``."""
    words = [
        rng.choice(SUBJECTS),
        rng.choice(VERBS),
        rng.choice(ADVERBS),
        rng.choice(ADJECTIVES[label]),
        rng.choice(ENDINGS),
    ]
    text = " ".join(w for w in words if w)
    return text[0].upper() + text[1:] + "."


def make_rows(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """``n`` (sentence, label) rows, the labels in turn, then shuffled."""
    labels = sorted(ADJECTIVES)
    rows = [(review(rng, labels[i % len(labels)]), labels[i % len(labels)]) for i in range(n)]
    rng.shuffle(rows)
    return rows


def wordpiece_vocab(texts: list[str]) -> list[str]:
    """Special tokens, single characters (also as ``##`` continuations, so any ASCII word can
    be split) and every lower-cased word of ``texts``, as BERT's pre-tokenizer splits them."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    words = sorted({w for t in texts for w in re.findall(r"[a-z0-9]+", t.lower())})
    vocab = SPECIAL_TOKENS + chars + ["##" + c for c in string.ascii_lowercase + string.digits]
    return vocab + [w for w in words if w not in set(vocab)]


def write_csv(path: str, rows) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)


def prepare_sample_data(out_dir: str = DEFAULT_DIR, seed: int = 0) -> dict[str, str]:
    """Write ``train.csv`` (300 rows), ``valid.csv`` (60 rows) and ``vocab.txt`` into
    ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    train, valid = make_rows(rng, 300), make_rows(rng, 60)
    paths = {name: os.path.join(out_dir, name) for name in ("train.csv", "valid.csv", "vocab.txt")}
    write_csv(paths["train.csv"], train)
    write_csv(paths["valid.csv"], valid)
    # the vocabulary covers every word a review can hold, seen in the data or not
    every_word = SUBJECTS + VERBS + ADVERBS + ENDINGS + sum(ADJECTIVES.values(), [])
    with open(paths["vocab.txt"], "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(wordpiece_vocab(every_word)) + "\n")
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=DEFAULT_DIR, help=f"default: {DEFAULT_DIR}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, path in prepare_sample_data(args.out_dir, args.seed).items():
        print(f"wrote {name}: {path}")


if __name__ == "__main__":
    main()
