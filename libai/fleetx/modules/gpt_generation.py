"""FleetX's GPT text generation as a task module: ``Model.module: GPTGenerationModule`` with
a ``Generation`` section (FleetX's ``generation_gpt_345M_single_card.yaml``), exported with
its key / value cache graphs and run again from them by ``tools/inference.py``."""

from __future__ import annotations

import logging

import torch
from omegaconf import OmegaConf

from libai.fleetx.modules.gpt import GPTModule
from libai.inference.generation import GenerationConfig

logger = logging.getLogger(__name__)

__all__ = ["GPTGenerationModule", "OnnxGenerator", "generation_config"]

#: FleetX ``Generation`` key -> GenerationConfig field (same meaning)
SAME = {
    "top_k": "top_k",
    "top_p": "top_p",
    "temperature": "temperature",
    "min_dec_len": "min_new_tokens",
    "max_dec_len": "max_new_tokens",
    "num_return_sequences": "num_return_sequences",
    "repetition_penalty": "repetition_penalty",
    "num_beams": "num_beams",
    "length_penalty": "length_penalty",
    "early_stopping": "early_stopping",
}
#: keys FleetX reads that change nothing here (Paddle kernels and flags; the cache is always on)
NO_EFFECT = ("use_topp_sampling", "inference", "use_cache", "bos_token_id", "decode_strategy")
STRATEGIES = ("sampling", "greedy_search", "beam_search")
#: FleetX's cap on generated tokens (max_dec_len < 0 or above it means this many)
MAX_DEC_LEN = 512


def generation_config(section, eos_token_id: int, seed: int | None) -> GenerationConfig:
    """The :class:`GenerationConfig` of FleetX's ``Generation`` section.

    ``decode_strategy``: ``sampling`` (FleetX's default: ``top_k`` (FleetX default 0 = off),
    ``top_p``, ``temperature``, seeded with ``Global.seed`` so every run, eager or exported,
    samples the same tokens), ``greedy_search``, ``beam_search`` (``num_beams``).
    ``max_dec_len`` / ``min_dec_len``: new tokens (FleetX caps ``max_dec_len`` at 512).
    ``length_penalty``: FleetX's default 0.0 ranks beam hypotheses by their summed
    log-probabilities, as PaddleNLP's ``sum / ((len + 5) / 6) ** 0`` does; another value is
    the exponent of transformers' ``sum / len ** length_penalty`` (FleetX's GPT has no beam
    search of its own; PaddleNLP's ``(len + 5) / 6`` base is not reproduced).
    eos and padding: the tokenizer's eos, as FleetX."""
    given = {} if section is None else OmegaConf.to_container(section, resolve=True)
    known = set(SAME) | set(NO_EFFECT) | {"eos_token_id", "pad_token_id"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown config key Generation.{unknown[0]} (known: {sorted(known)})")
    strategy = given.get("decode_strategy", "sampling")
    if strategy not in STRATEGIES:
        raise ValueError(
            f"Generation.decode_strategy must be one of {STRATEGIES}, got {strategy!r}"
        )
    settings = {"top_k": 0, "max_new_tokens": 20, "length_penalty": 0.0}
    settings.update({SAME[k]: v for k, v in given.items() if k in SAME and v is not None})
    if settings["max_new_tokens"] < 0 or settings["max_new_tokens"] > MAX_DEC_LEN:
        settings["max_new_tokens"] = MAX_DEC_LEN
    settings["do_sample"] = strategy == "sampling"
    if strategy != "beam_search":
        settings["num_beams"] = 1
    eos = given.get("eos_token_id") or eos_token_id
    pad = given.get("pad_token_id") or eos_token_id
    config = GenerationConfig(**settings, eos_token_id=eos, pad_token_id=pad, seed=seed)
    config.validate()
    return config


class OnnxGenerator:
    """Generation on the graphs exported under ``model_dir`` (``rank_0/model.onnx`` and
    ``model_with_past.onnx``) in onnxruntime: ``generator(batch)`` returns
    ``{"output_ids": [rows, new tokens]}``, as the eager module's ``predict_step``."""

    def __init__(self, model_dir: str, config: GenerationConfig, max_positions=None):
        from libai.fleetx.export import find_onnx
        from libai.onnx_export.ort_generation import OrtStepper

        self.path = find_onnx(model_dir)
        self.stepper, self.config = OrtStepper(self.path), config
        self.max_positions = max_positions

    def __call__(self, batch) -> dict:
        ids = generate_new_tokens(self.stepper, batch, self.config, self.max_positions)
        return {"output_ids": ids}


def check_lengths(prompt: int, config: GenerationConfig, max_positions, prompt_key: str):
    """A prompt of ``prompt`` tokens plus ``max_dec_len`` new ones must fit the model's
    positions: else one line naming the three keys (before any graph or model runs)."""
    if max_positions is None or prompt + config.max_new_tokens <= int(max_positions):
        return
    raise ValueError(
        f"{prompt_key} ({prompt}) + Generation.max_dec_len ({config.max_new_tokens}) = "
        f"{prompt + config.max_new_tokens} tokens, more than Model.max_position_embeddings "
        f"({max_positions}): shorten the prompt or lower Generation.max_dec_len"
    )


def generate_new_tokens(stepper, batch, config: GenerationConfig, max_positions=None):
    """The tokens generated after each prompt of ``batch`` (``input_ids``, optional
    ``attention_mask`` for left padding); ``max_positions``: the model's position limit,
    checked against the prompt plus the new tokens first."""
    from libai.inference.generation import generate

    input_ids = torch.as_tensor(batch["input_ids"])
    check_lengths(input_ids.shape[1], config, max_positions, "the prompt length")
    mask = batch.get("attention_mask")
    mask = None if mask is None else torch.as_tensor(mask)
    sequences = generate(stepper, input_ids, mask, config)
    return sequences[:, input_ids.shape[1] :]


class GPTGenerationModule(GPTModule):
    """FleetX's ``GPTGenerationModule``: a GPT continuing the prompts of its batches
    (``input_ids``) with the ``Generation`` settings (:func:`generation_config`).

    ``tools/export.py`` writes the prompt graph and the key / value cache graph
    (``Engine.save_load.output_dir/rank_0/``); ``tools/inference.py`` with
    ``Inference.model_dir`` generates from them in onnxruntime (:class:`OnnxGenerator`),
    without it from the eager model (``predict_step``). Both return
    ``{"output_ids", "texts"}``: the new tokens and their decoded text (also logged).
    """

    #: export the cache graph too (generation reads it)
    export_with_past = True

    def process_configs(self, configs):
        self.generation_cfgs = generation_config(
            configs.get("Generation"), self.tokenizer.eos_token_id, int(configs.Global.seed)
        )
        self.max_positions = OmegaConf.select(configs, "Model.max_position_embeddings")
        prompt = OmegaConf.select(configs, "Data.Test.dataset.max_seq_len")
        if prompt is not None:  # the inference prompts: refused before any model is built
            key = "Data.Test.dataset.max_seq_len"
            check_lengths(int(prompt), self.generation_cfgs, self.max_positions, key)
        return configs

    def predict_step(self, batch):
        from libai.inference.generation.stepper import ModelStepper

        return {
            "output_ids": generate_new_tokens(
                ModelStepper(self.model), batch, self.generation_cfgs, self.max_positions
            )
        }

    def predict_step_end(self, outputs):
        return self._with_texts(outputs)

    def onnx_predictor(self, model_dir: str):
        return OnnxGenerator(model_dir, self.generation_cfgs, self.max_positions)

    def inference_end(self, outputs):
        return self._with_texts(outputs)

    def _with_texts(self, outputs: dict) -> dict:
        texts = [self.tokenizer.decode([int(t) for t in row]) for row in outputs["output_ids"]]
        for text in texts:
            logger.info("generated: %s", text)
        return {**outputs, "texts": texts}
