"""The black box's ``--task pretraining`` with Megatron's flags: the model built from
``--num-layers`` / ``--hidden-size`` / ``--num-attention-heads`` / ``--max-position-embeddings``
(``--ffn-hidden-size``), the tokenizer from ``--tokenizer-type`` / ``--vocab-file`` /
``--merge-file``, and the objective of the tokenizer's family:

- ``BertWordPieceLowerCase`` / ``BertWordPieceCase``: BERT's masked LM + next-sentence
  prediction (transformers' ``BertForPreTraining``) on sentence-pair samples of Megatron's
  ``--split-sentences`` data (:class:`~libai.data.datasets.bert_dataset.BertDataset`), in
  transformers' names (``token_type_ids``, ``labels``, ``next_sentence_label``);
- ``GPT2BPETokenizer``: a causal LM (``GPT2LMHeadModel``) on GPT samples of the documents.

Without the architecture flags the model of ``--pretrained-model-name-or-path`` is trained
(BERT: its ``BertForPreTraining`` weights, the same objective). The result is saved as a
Hugging Face directory of that class.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "ARCHITECTURE_FLAGS",
    "BERT_TOKENIZERS",
    "GPT_TOKENIZERS",
    "BertPretrainingSamples",
    "add_megatron_model_flags",
    "bert_black_box_datasets",
    "bert_pretraining_datasets",
    "build_pretraining_model",
    "check_pretraining_args",
    "from_megatron_flags",
    "pretraining_family",
    "pretraining_tokenizer",
]

BERT_TOKENIZERS = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}  # lower case
GPT_TOKENIZERS = ("GPT2BPETokenizer",)
#: Megatron's architecture flags (dest names); any of them builds the model from the flags
ARCHITECTURE_FLAGS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "max_position_embeddings",
)
BERT_FAMILY = ("bert",)


def add_megatron_model_flags(parser) -> None:
    """Megatron's model and tokenizer flags (``--task pretraining`` from scratch)."""
    g = parser.add_argument_group("model and tokenizer (Megatron's flags, pretraining)")
    g.add_argument("--num-layers", type=int, default=None)
    g.add_argument("--hidden-size", type=int, default=None)
    g.add_argument("--num-attention-heads", type=int, default=None)
    g.add_argument("--ffn-hidden-size", type=int, default=None, help="default: 4 x hidden size")
    g.add_argument("--max-position-embeddings", type=int, default=None)
    g.add_argument("--hidden-dropout", type=float, default=None, help="default: the model's")
    g.add_argument("--attention-dropout", type=float, default=None, help="default: the model's")
    g.add_argument(
        "--tokenizer-type",
        choices=[*BERT_TOKENIZERS, *GPT_TOKENIZERS],
        default=None,
        help="Bert*: masked LM + next sentence (BertForPreTraining); GPT2BPETokenizer: causal LM",
    )
    g.add_argument("--vocab-file", default=None, help="vocab.txt (BERT) / vocab.json (GPT-2)")
    g.add_argument("--merge-file", default=None, help="merges.txt (GPT2BPETokenizer)")


def from_megatron_flags(args) -> bool:
    """Whether Megatron's architecture flags build the model."""
    return any(getattr(args, f, None) is not None for f in ARCHITECTURE_FLAGS)


def check_pretraining_args(args) -> None:
    """What ``--task pretraining`` needs, checked before any collective."""
    tokenizer_type = getattr(args, "tokenizer_type", None)
    if from_megatron_flags(args):
        missing = [f for f in ARCHITECTURE_FLAGS[:3] if getattr(args, f, None) is None]
        if missing:
            flags = ", ".join("--" + f.replace("_", "-") for f in missing)
            raise ValueError(f"--task pretraining from Megatron's flags also needs {flags}")
        if tokenizer_type is None and not args.pretrained_model_name_or_path:
            raise ValueError(
                "--task pretraining from Megatron's flags needs --tokenizer-type and "
                "--vocab-file (or --pretrained-model-name-or-path for its tokenizer)"
            )
    elif not args.pretrained_model_name_or_path:
        raise ValueError(
            "--task pretraining needs --pretrained-model-name-or-path DIR, or the model from "
            "Megatron's flags: --num-layers --hidden-size --num-attention-heads --tokenizer-type "
            "--vocab-file"
        )
    if tokenizer_type is not None:
        needed = ["vocab_file"] + (["merge_file"] if tokenizer_type in GPT_TOKENIZERS else [])
        for flag in needed:
            value = getattr(args, flag, None)
            if value is None:
                raise ValueError(
                    f"--tokenizer-type {tokenizer_type} needs --{flag.replace('_', '-')}"
                )
            if not os.path.isfile(value):
                raise FileNotFoundError(f"--{flag.replace('_', '-')} {value!r} is not a file")


def pretraining_family(args, model_type: str | None) -> str:
    """``"bert"`` (masked LM + next sentence) or ``"gpt"`` (causal LM)."""
    tokenizer_type = getattr(args, "tokenizer_type", None)
    if tokenizer_type is not None:
        return "bert" if tokenizer_type in BERT_TOKENIZERS else "gpt"
    return "bert" if model_type in BERT_FAMILY else "gpt"


def pretraining_tokenizer(args):
    """A transformers tokenizer: of ``--tokenizer-type`` on ``--vocab-file`` (/
    ``--merge-file``), else the model directory's."""
    import transformers

    tokenizer_type = getattr(args, "tokenizer_type", None)
    # transformers 5 reads the files from vocab= / merges= (it ignores vocab_file=)
    if tokenizer_type in BERT_TOKENIZERS:
        return transformers.BertTokenizerFast(
            vocab=args.vocab_file, do_lower_case=BERT_TOKENIZERS[tokenizer_type]
        )
    if tokenizer_type in GPT_TOKENIZERS:
        return transformers.GPT2TokenizerFast(vocab=args.vocab_file, merges=args.merge_file)
    return transformers.AutoTokenizer.from_pretrained(args.pretrained_model_name_or_path)


def _config(args, family: str, tokenizer):
    """The model config: the model directory's (when given) or the family's defaults, with
    Megatron's architecture flags and the tokenizer's vocabulary."""
    import transformers

    path = args.pretrained_model_name_or_path
    if path:
        config = transformers.AutoConfig.from_pretrained(path)
    else:
        config = transformers.BertConfig() if family == "bert" else transformers.GPT2Config()
    hidden = args.hidden_size or config.hidden_size
    values = {
        "num_hidden_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "max_position_embeddings": args.max_position_embeddings,
        "vocab_size": len(tokenizer),
    }
    if family == "bert":
        values["intermediate_size"] = args.ffn_hidden_size or 4 * hidden
        values["pad_token_id"] = tokenizer.pad_token_id
        values["hidden_dropout_prob"] = args.hidden_dropout
        values["attention_probs_dropout_prob"] = args.attention_dropout
    else:  # GPT-2's names
        values = {
            "n_layer": values["num_hidden_layers"],
            "n_embd": values["hidden_size"],
            "n_head": values["num_attention_heads"],
            "n_positions": values["max_position_embeddings"],
            "n_inner": args.ffn_hidden_size,
            "vocab_size": values["vocab_size"],
            "resid_pdrop": args.hidden_dropout,
            "embd_pdrop": args.hidden_dropout,
            "attn_pdrop": args.attention_dropout,
        }
    for key, value in values.items():
        if value is not None:
            setattr(config, key, value)
    return config


def build_pretraining_model(args, family: str, tokenizer):
    """The transformers model that pretraining trains: built from Megatron's flags (fresh
    weights from ``--seed``), else ``--pretrained-model-name-or-path``'s weights."""
    import transformers

    cls = transformers.BertForPreTraining if family == "bert" else transformers.GPT2LMHeadModel
    if not from_megatron_flags(args):
        model = cls.from_pretrained(args.pretrained_model_name_or_path)
        logger.info("pretraining %s from %s", cls.__name__, args.pretrained_model_name_or_path)
        return model
    config = _config(args, family, tokenizer)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = cls(config)
    logger.info(
        "pretraining %s built from Megatron's flags: %d layers, hidden %d, %d heads, vocab %d",
        cls.__name__,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.vocab_size,
    )
    return model


class BertPretrainingSamples(torch.utils.data.Dataset):
    """A :class:`~libai.data.datasets.bert_dataset.BertDataset` in transformers' names:
    ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels`` (-100 where nothing is
    predicted) and ``next_sentence_label`` (1: B does not follow A)."""

    NAMES = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "tokentype_ids": "token_type_ids",
        "lm_labels": "labels",
        "ns_labels": "next_sentence_label",
    }

    def __init__(self, samples):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index) -> dict[str, torch.Tensor]:
        item = self.samples[index]
        return {new: item[old] for old, new in self.NAMES.items() if old in item}


def megatron_ids(tokenizer) -> SimpleNamespace:
    """A transformers tokenizer's special ids under Megatron's names (``cls``, ``sep``,
    ``mask``, ``pad``, ``vocab_size``), as libai's datasets read them."""
    return SimpleNamespace(
        cls=tokenizer.cls_token_id,
        sep=tokenizer.sep_token_id,
        mask=tokenizer.mask_token_id,
        pad=tokenizer.pad_token_id,
        vocab_size=len(tokenizer),
    )


def bert_pretraining_datasets(
    data_prefix: str,
    tokenizer,
    *,
    data_impl: str = "mmap",
    splits_string: str = "980,20",
    train_valid_test_num_samples=(None, None, None),
    max_seq_length: int = 512,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    seed: int = 1234,
    skip_warmup: bool = True,
    binary_head: bool = True,
):
    """``(train, valid, test)`` BERT masked-LM (+ next-sentence with ``binary_head``) samples
    of Megatron's sentence-indexed data ``data_prefix`` split by ``splits_string``, in
    transformers' names (:class:`BertPretrainingSamples`; a split with no samples is
    ``None``). ``tokenizer`` is a transformers tokenizer or any object with Megatron's ids."""
    from libai.config import LazyCall
    from libai.data.build import build_train_valid_test_datasets
    from libai.data.data_utils import get_indexed_dataset
    from libai.data.datasets.bert_dataset import BertDataset

    ids = tokenizer if hasattr(tokenizer, "cls") else megatron_ids(tokenizer)
    split = [float(x) for x in str(splits_string).split(",")]
    split += [0.0] * (3 - len(split))
    config = LazyCall(BertDataset)(
        name="pretraining",
        tokenizer=ids,
        data_prefix=data_prefix,
        indexed_dataset=LazyCall(get_indexed_dataset)(
            data_prefix=data_prefix, data_impl=data_impl, skip_warmup=skip_warmup
        ),
        max_seq_length=max_seq_length,
        mask_lm_prob=masked_lm_prob,
        short_seq_prob=short_seq_prob,
        seed=seed,
        binary_head=binary_head,
    )
    built = build_train_valid_test_datasets(
        config, [split], [1.0], list(train_valid_test_num_samples)
    )
    return tuple(None if d is None else BertPretrainingSamples(d) for d in built)


def bert_black_box_datasets(args, tokenizer, num_samples: list[int]):
    """``(train, valid)`` BERT samples of the black box's flags (``--data-path`` prefix,
    ``--split``, ``--seq-length``, Megatron's ``--mask-prob`` / ``--short-seq-prob`` when
    the parser has them, else ``--mlm-probability`` / 0.1)."""
    short_seq_prob = getattr(args, "short_seq_prob", None)  # 0.0 is a value: no short ones
    train, valid, _ = bert_pretraining_datasets(
        args.data_path,
        tokenizer,
        data_impl=args.data_impl,
        splits_string=args.split,
        train_valid_test_num_samples=[*num_samples, 0],
        max_seq_length=args.seq_length,
        masked_lm_prob=getattr(args, "mask_prob", None) or args.mlm_probability,
        short_seq_prob=0.1 if short_seq_prob is None else float(short_seq_prob),
        seed=args.seed,
    )
    return train, valid
