"""Masked, causal and sequence-to-sequence language modelling (run_mlm / run_clm /
run_summarization) and Megatron pretraining's perplexity."""

from __future__ import annotations

import numpy as np
import torch

from libai.accelerate.tasks.common import (
    CHUNK,
    IGNORE_INDEX,
    MODEL_INPUTS,
    MaskedLMDataset,
    Prepared,
    Task,
    TensorDictDataset,
    add_to_sums,
    check_columns,
    column_texts,
    encode_padded,
    ensure_pad_token,
    long_tensor,
    named_splits,
    perplexity_of,
    seq_length_setting,
    task_setting,
)


class _LanguageModeling(Task):
    """Perplexity = exp(sum over batches of mean loss x predicted tokens / predicted tokens)."""

    metrics = ("perplexity",)

    @staticmethod
    def _predicted_tokens(labels: torch.Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def update(self, sums: dict, batch: dict, outputs) -> None:
        tokens = self._predicted_tokens(batch["labels"])
        loss = float(outputs["loss"].detach()) if tokens else 0.0  # no token: the loss is nan
        add_to_sums(sums, "loss_sum", loss * tokens)
        add_to_sums(sums, "tokens", tokens)

    def compute(self, sums: dict) -> dict[str, float]:
        return {"perplexity": perplexity_of(sums.get("loss_sum", 0.0), sums.get("tokens", 0.0))}


def _grouped_blocks(dataset, column: str, hint: str, tokenizer, seq_length: int, specials: bool):
    """run_mlm / run_clm ``group_texts``: tokenize each non-empty text (with its special
    tokens), concatenate, cut into ``seq_length`` blocks, drop the remainder. Returns the
    tensors (all-ones ``attention_mask``) and, when asked, the special-tokens mask."""
    texts = [t for t in column_texts(dataset, column, hint) if t.strip()]
    keys = [*MODEL_INPUTS, "special_tokens_mask"] if specials else list(MODEL_INPUTS)
    pieces: dict[str, list[np.ndarray]] = {}
    for lo in range(0, len(texts), CHUNK):
        enc = tokenizer(texts[lo : lo + CHUNK], return_special_tokens_mask=specials, verbose=False)
        for key in keys:
            if key in enc:
                pieces.setdefault(key, []).extend(np.asarray(r, dtype=np.int64) for r in enc[key])
    total = sum(len(r) for r in pieces.get("input_ids", []))
    blocks = total // seq_length
    if blocks == 0:
        raise ValueError(
            f"{hint}: {total} tokens in column {column!r}, fewer than one block of seq_length "
            f"{seq_length}"
        )
    tensors = {
        k: torch.from_numpy(np.concatenate(v)[: blocks * seq_length].reshape(blocks, seq_length))
        for k, v in pieces.items()
    }
    tensors["attention_mask"] = torch.ones(blocks, seq_length, dtype=torch.long)
    return tensors, tensors.pop("special_tokens_mask", None)


class MaskedLM(_LanguageModeling):
    """Texts grouped into blocks, masked per sample from ``(seed, index)`` (see
    :class:`MaskedLMDataset`). Perplexity over the masked tokens."""

    name = "masked_lm"
    auto_model = "AutoModelForMaskedLM"

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = seq_length_setting(args)
        column = task_setting(args, "text_column", "text")
        probability = float(task_setting(args, "mlm_probability", 0.15))
        seed = int(task_setting(args, "seed", 1234))
        if tokenizer.mask_token_id is None:
            raise ValueError("masked_lm needs a tokenizer with a mask token")
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [column], hint)
        out = []
        for dataset, hint in splits:
            tensors, special = _grouped_blocks(dataset, column, hint, tokenizer, seq_length, True)
            if special is None:  # a tokenizer without the mask: protect its special ids
                special = torch.isin(tensors["input_ids"], torch.tensor(tokenizer.all_special_ids))
            out.append(
                MaskedLMDataset(
                    tensors,
                    special,
                    mask_token_id=tokenizer.mask_token_id,
                    vocab_size=len(tokenizer),
                    probability=probability,
                    seed=seed,
                )
            )
        return Prepared(out[0], out[1] if len(out) > 1 else None, {})


class CausalLM(_LanguageModeling):
    """Texts grouped into blocks; ``labels`` = ``input_ids`` (the model shifts). Perplexity over
    the predicted tokens (``seq_length - 1`` per block)."""

    name = "causal_lm"
    auto_model = "AutoModelForCausalLM"

    @staticmethod
    def _predicted_tokens(labels: torch.Tensor) -> int:
        return int((labels[..., 1:] != IGNORE_INDEX).sum())

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = seq_length_setting(args)
        column = task_setting(args, "text_column", "text")
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, [column], hint)
        out = []
        for dataset, hint in splits:
            tensors, _ = _grouped_blocks(dataset, column, hint, tokenizer, seq_length, False)
            tensors["labels"] = tensors["input_ids"]  # shared storage; collate copies
            out.append(TensorDictDataset(tensors))
        return Prepared(out[0], out[1] if len(out) > 1 else None, {})


class Seq2SeqLM(_LanguageModeling):
    """Source -> target (T5 / BART): the source padded to ``seq_length`` (``input_ids``,
    ``attention_mask``; never ``token_type_ids``), ``labels`` the target
    ids padded to ``target_length`` with -100 (the model builds ``decoder_input_ids`` from them).
    Perplexity over the target tokens."""

    name = "seq2seq_lm"
    auto_model = "AutoModelForSeq2SeqLM"

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        seq_length = seq_length_setting(args)
        target_length = int(task_setting(args, "target_length", seq_length))
        columns = [
            task_setting(args, "source_column", "source"),
            task_setting(args, "target_column", "target"),
        ]
        splits = named_splits(train, valid, args)
        for dataset, hint in splits:
            check_columns(dataset, columns, hint)
        model_kwargs: dict = {}
        ensure_pad_token(tokenizer, model_kwargs)
        out = []
        for dataset, hint in splits:
            tensors = encode_padded(
                tokenizer, [column_texts(dataset, columns[0], hint)], seq_length
            )
            tensors.pop("token_type_ids", None)  # no encoder-decoder model takes them
            targets = column_texts(dataset, columns[1], hint)
            labels = []
            for lo in range(0, len(targets), CHUNK):
                enc = tokenizer(
                    text_target=targets[lo : lo + CHUNK],
                    truncation=True,
                    max_length=target_length,
                    padding="max_length",
                )
                for ids, mask in zip(enc["input_ids"], enc["attention_mask"]):
                    labels.append([t if m else IGNORE_INDEX for t, m in zip(ids, mask)])
            tensors["labels"] = long_tensor(labels)
            out.append(TensorDictDataset(tensors))
        return Prepared(out[0], out[1] if len(out) > 1 else None, model_kwargs)


class PreTraining(_LanguageModeling):
    """Pretraining on Megatron ``.bin/.idx`` data: the caller builds the datasets, so there is
    nothing to prepare here. GPT (items ``input_ids`` and next-token ``labels``, every token
    predicted): perplexity over the labelled tokens. BERT (``BertForPreTraining``'s outputs):
    the masked-LM perplexity over the masked tokens and the next-sentence accuracy."""

    name = "pretraining"
    auto_model = "AutoModelForCausalLM"

    def update(self, sums: dict, batch: dict, outputs) -> None:
        if "prediction_logits" not in outputs:
            return super().update(sums, batch, outputs)
        logits = outputs["prediction_logits"].detach().float()
        labels = batch["labels"].to(logits.device)
        loss_sum = torch.nn.functional.cross_entropy(
            logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        add_to_sums(sums, "loss_sum", loss_sum.item())
        add_to_sums(sums, "tokens", self._predicted_tokens(labels))
        if "seq_relationship_logits" in outputs and "next_sentence_label" in batch:
            pred = outputs["seq_relationship_logits"].detach().argmax(-1)
            gold = batch["next_sentence_label"].to(pred.device)
            add_to_sums(sums, "next_sentence_correct", (pred == gold).sum().item())
            add_to_sums(sums, "next_sentence_count", gold.numel())

    def compute(self, sums: dict) -> dict[str, float]:
        out = super().compute(sums)
        if sums.get("next_sentence_count"):
            out["next_sentence_accuracy"] = (
                sums["next_sentence_correct"] / sums["next_sentence_count"]
            )
        return out

    def prepare(self, train, valid, tokenizer, args) -> Prepared:
        raise NotImplementedError(
            "pretraining data is Megatron's indexed .bin/.idx data, built by the caller "
            "(libai.accelerate.data.pretraining_datasets), not prepared from rows"
        )
