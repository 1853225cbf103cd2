"""A sample chat data set and a tiny ChatML tokenizer, built offline in a second.

``python projects/chat_sft/sample_data.py output/chat_sample`` (from the checkout root)
writes::

    output/chat_sample/train.jsonl      arithmetic conversations, some multi-turn, some with
    output/chat_sample/valid.jsonl      a system prompt, in the ``messages`` format
    output/chat_sample/tokenizer/       tokenizer.json (byte-level BPE with <|endoftext|>,
                                        <|im_start|>, <|im_end|>) and tokenizer_config.json
                                        (eos <|im_end|>, pad <|endoftext|>, the ChatML template)

which is what ``configs/qwen2_chat_sft_tiny.py`` reads by default, so a first run needs no
download. ``--no-template`` leaves the template out of tokenizer_config.json (the dataset then
falls back to the same built-in ChatML).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `projects.chat_sft` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from projects.chat_sft.chat_template import CHATML_TEMPLATE, ChatTemplate  # noqa: E402

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SYSTEM_PROMPTS = ("You are a careful calculator.", "Answer in one short sentence.")


def make_conversations(count: int, seed: int = 0) -> list[dict]:
    """``count`` records ``{"messages": [...]}``: "What is a plus b?" answered with the sum,
    half of them followed by a second question about the result, half with a system prompt."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        a, b, c = rng.randrange(10), rng.randrange(10), rng.randrange(10)
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        messages.append({"role": "user", "content": f"What is {a} plus {b}?"})
        messages.append({"role": "assistant", "content": f"{a} plus {b} is {a + b}."})
        if rng.random() < 0.5:
            s = a + b
            messages.append({"role": "user", "content": f"And {s} minus {c}?"})
            messages.append({"role": "assistant", "content": f"{s} minus {c} is {s - c}."})
        records.append({"messages": messages})
    return records


def write_jsonl(path, records) -> Path:
    """One JSON object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_tokenizer(
    directory, records, vocab_size: int = 400, chat_template: str | None = CHATML_TEMPLATE
) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on the ChatML text of ``records``, with
    ``<|endoftext|>`` (pad), ``<|im_start|>`` and ``<|im_end|>`` (eos) as special tokens, and a
    ``tokenizer_config.json`` naming them and holding ``chat_template`` (unless ``None``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    chatml = ChatTemplate(CHATML_TEMPLATE)
    corpus = [chatml.render(r["messages"]) for r in records]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory


def build_sample(root, train: int = 256, valid: int = 32, chat_template=CHATML_TEMPLATE) -> dict:
    """Write the sample under ``root``; returns the paths (``train``, ``valid``, ``tokenizer``)."""
    root = Path(root)
    train_records = make_conversations(train, seed=0)
    valid_records = make_conversations(valid, seed=1)
    return {
        "train": write_jsonl(root / "train.jsonl", train_records),
        "valid": write_jsonl(root / "valid.jsonl", valid_records),
        "tokenizer": write_tokenizer(
            root / "tokenizer", train_records + valid_records, chat_template=chat_template
        ),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", help="where to write train.jsonl, valid.jsonl, tokenizer/")
    parser.add_argument("--train", type=int, default=256, help="training conversations")
    parser.add_argument("--valid", type=int, default=32, help="validation conversations")
    parser.add_argument(
        "--no-template", action="store_true", help="no chat_template in tokenizer_config.json"
    )
    args = parser.parse_args(argv)
    template = None if args.no_template else CHATML_TEMPLATE
    paths = build_sample(args.output_dir, args.train, args.valid, chat_template=template)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
