"""``TextGenerationPipeline``: prompts in, generated text out, for every generative model
of the zoo (decoder-only GPT-2 / Llama / Qwen2 and encoder-decoder T5 / mT5), on any tensor /
pipeline / data-parallel layout. Outputs are shaped like ``transformers.pipeline(
"text-generation")`` (``"text2text-generation"`` for T5): ``[{"generated_text": ...}]`` per
prompt (one dict per returned sequence).

Usage (launch with ``bash tools/infer.sh my_script.py 4``; rank 0 gets the result)::

    pipe = TextGenerationPipeline(model_path="path/to/hf_llama", mode="huggingface",
                                  tensor_parallel=2, pipeline_parallel=2)
    pipe("Once upon a time", max_new_tokens=64, do_sample=True, top_p=0.9, seed=0)

Call parameters: every :class:`~libai.inference.generation.GenerationConfig` field
(``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``num_beams``,
``repetition_penalty``, ``stop_strings``, ``seed``, ...), ``streamer`` (a callable given the
new token ids ``[rows]`` after every step, on global rank 0), ``return_full_text``
(decoder-only: prompt + continuation, the default, as transformers) and
``skip_special_tokens``. Defaults come from the model directory's ``generation_config.json``
/ ``config.json`` (or the tokenizer's eos / pad tokens).

Fixed-shape decoding (transformers' option names, as call or construction parameters):
``cache_implementation="static"`` keeps the KV cache in buffers of ``max_cache_len`` slots
(default prompt + ``max_new_tokens``) so that every decode step has the same shapes, and
``compile=True`` (which implies it) runs each decode step through ``torch.compile``: with CUDA
graphs (``mode="reduce-overhead"``) on ``device="cuda"``, with the default mode on CPU. The
first call of a new (batch rows, cache length) compiles; give a fixed ``max_cache_len`` so that
calls of different lengths share it. The tokens equal the default dynamic cache's::

    pipe = TextGenerationPipeline(model_path=..., mode="huggingface", device="cuda",
                                  compile=True, max_cache_len=512)

Prompts longer than the model's positions are rejected (``ValueError`` naming the lengths);
nothing is truncated silently. Batched prompts are left-padded; each row's result equals
its unbatched run.
"""

from __future__ import annotations

import json
import os

import torch

from libai.inference.basic import BasePipeline
from libai.inference.generation import GenerationConfig, ModelStepper, generate

_POST = ("return_full_text", "skip_special_tokens")
#: settings a generation_config.json / config.json may carry that we read
_FILE_KEYS = (
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "num_beams",
    "length_penalty",
    "early_stopping",
)


class TextGenerationPipeline(BasePipeline):
    """Generate text from prompts (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            raise ValueError(
                "text generation needs a tokenizer (config `tokenization` or model dir)"
            )
        self.stepper = ModelStepper(self.model, self.pipe, decode_layout=True)
        self.generation_config = self.default_generation_config()

    # ---- defaults -----------------------------------------------------------------------------
    def default_generation_config(self) -> GenerationConfig:
        """Settings of the model directory (``generation_config.json`` over ``config.json``),
        then the tokenizer's eos / pad ids where those are unset."""
        found: dict = {}
        sources = [self.hf_config]
        if self.model_path and os.path.isfile(self._file("generation_config.json")):
            with open(self._file("generation_config.json"), encoding="utf-8") as f:
                sources.append(json.load(f))
        for source in sources:
            found.update({k: source[k] for k in _FILE_KEYS if source.get(k) is not None})
        tok = self.tokenizer
        if "eos_token_id" not in found and tok.eos_token_id is not None:
            found["eos_token_id"] = tok.eos_token_id
        if "pad_token_id" not in found and tok.pad_token_id is not None:
            found["pad_token_id"] = tok.pad_token_id
        if self.stepper.is_encoder_decoder and "decoder_start_token_id" not in found:
            found["decoder_start_token_id"] = found.get("pad_token_id", 0)
        return GenerationConfig().updated(**found)

    def _file(self, name: str) -> str:
        return os.path.join(self.model_path, name)

    # ---- parameters ---------------------------------------------------------------------------
    def _parse_parameters(self, **params):
        forward = (*GenerationConfig.names(), "streamer")
        pre, fwd, post = self.split_parameters(params, forward=forward, postprocess=_POST)
        settings = {k: v for k, v in fwd.items() if k != "streamer"}
        GenerationConfig().updated(**settings)  # a bad value fails now, on every rank
        return pre, fwd, post

    # ---- steps --------------------------------------------------------------------------------
    def preprocess(self, inputs: list, **params) -> dict:
        """Token ids of the prompts, left-padded, with their attention mask."""
        for text in inputs:
            if not isinstance(text, str):
                raise TypeError(f"prompts must be strings, got {type(text).__name__}")
            if not text.strip():
                raise ValueError("empty prompt: give at least one non-space character")
        return self.encode_prompts(list(inputs), add_special_tokens=True)

    def encode_prompts(self, texts: list[str], add_special_tokens: bool) -> dict:
        """``{"prompts", "input_ids", "attention_mask"}`` of ``texts``: token ids left-padded
        with the generation config's pad id (0 when unset), on the pipeline's device."""
        rows = self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        pad = self.generation_config.pad_token_id
        pad = 0 if pad is None else pad
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                input_ids[i, width - len(row) :] = torch.tensor(row)
                attention_mask[i, width - len(row) :] = 1
        return {
            "prompts": texts,
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention_mask.to(self.device),
        }

    def forward(self, model_inputs: dict, streamer=None, **settings):
        config = self.generation_config.updated(**settings)
        if streamer is not None and self.dist_util.rank != 0:
            streamer = None
        sequences = generate(
            self.stepper,
            model_inputs["input_ids"],
            model_inputs["attention_mask"],
            config,
            tokenizer=self.tokenizer,
            streamer=streamer,
        )
        return {
            "prompts": model_inputs["prompts"],
            "new_tokens": sequences[:, self._prompt_length(model_inputs) :].cpu(),
            "per_prompt": config.num_return_sequences,
            "eos": config.eos_token_ids,
        }

    def _prompt_length(self, model_inputs: dict) -> int:
        return 1 if self.stepper.is_encoder_decoder else model_inputs["input_ids"].shape[1]

    def postprocess(self, outputs: dict, return_full_text: bool = True, skip_special_tokens=True):
        per_prompt, eos = outputs["per_prompt"], set(outputs["eos"])
        full = return_full_text and not self.stepper.is_encoder_decoder
        results = []
        for i, prompt in enumerate(outputs["prompts"]):
            texts = []
            for row in outputs["new_tokens"][i * per_prompt : (i + 1) * per_prompt].tolist():
                cut = next((j for j, t in enumerate(row) if t in eos), len(row))
                text = self.tokenizer.decode(row[:cut], skip_special_tokens=skip_special_tokens)
                texts.append({"generated_text": prompt + text if full else text})
            results.append(texts)
        return results


__all__ = ["TextGenerationPipeline"]
