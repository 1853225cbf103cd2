"""A libai model as the generation loops see it: "next-token logits after these sequences".

:class:`ModelStepper` owns the :class:`~libai.layers.KVCache` of one generation and feeds the
model only the tokens not yet cached. It works on any pipeline stage: each stage runs its own
layers (``model.decode_stage`` / ``encode_stage``) and hands hidden states to the next through
:class:`~libai.inference.stage_comm.StagePipe`; the last stage returns full-vocabulary logits
and :meth:`share` broadcasts what it decides to the other stages.

A model generates when it defines ``decode_stage(x, attention_mask, position_ids, cache)``
(decoder-only: GPT-2, Llama, Qwen2) or ``encode_stage`` + ``decode_stage(x, position_bias,
cache=, encoder_states=, encoder_mask=)`` (encoder-decoder: T5, mT5).

**Caches and compilation** (per stepper, overridable per ``generate`` call through the
:class:`~libai.inference.generation.GenerationConfig` fields of the same names):

- ``cache_implementation="dynamic"`` (default): a :class:`~libai.layers.KVCache`; attention
  reads the tokens cached so far, so every step has new shapes.
- ``"static"``: a :class:`~libai.layers.kv_cache.StaticKVCache` of ``max_cache_len`` slots (default
  prompt + ``max_new_tokens``): attention always runs over every slot behind a mask, so every
  decode step (after the prompt step) has the same shapes. Reused by the next generation of
  the same rows and length (its buffers keep their addresses).
- ``compile=True`` (implies the static cache): the decode step (``decode_stage`` for
  ``[rows, 1]`` tokens) runs through ``torch.compile``; on CUDA with
  ``mode="reduce-overhead"`` (CUDA graphs: one graph replay per token), elsewhere with the
  default mode (Inductor's fused CPU kernels). The prompt step runs eagerly. It compiles once
  per (rows, cache length, stage): pass a fixed ``max_cache_len`` to serve calls of different
  lengths with one compiled step.

**Greedy decoding in one graph** (:meth:`ModelStepper.greedy_next`): with the compiled step,
a decoder-only model on one pipeline stage and greedy search without logits processors, the
compiled function also does the per-token bookkeeping (the slot to write, each row's
position, the attention mask over the slots) on device buffers it advances in place, and
picks the token (argmax): each new token is one compiled call (one CUDA-graph replay), with
no eager kernels around it. The tokens are the same as the unfused path's.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from libai.inference.stage_comm import StagePipe
from libai.layers.kv_cache import KVCache, StaticKVCache
from libai.models.contract import EncoderDecoderGenerator, Generator
from libai.models.utils.hf_export import model_libai_cfg


@torch.no_grad()
def use_decode_layout(model: nn.Module) -> int:
    """Store every 2-D weight of ``model`` column-major (``W.t()`` contiguous), in place.

    ``F.linear(x, W)`` multiplies by ``W.t()``; with that contiguous the GEMM streams the
    weight in its natural order, which on CPU makes the skinny products of decoding (a few
    rows times a large weight) up to ~2x faster (the tied GPT-2 head at batch 8: 23 -> 13 ms)
    at no memory cost: same values, same shapes, other strides. Parameters that are
    DTensors (tensor-parallel stages) are left as they are. Returns the number of weights
    changed.
    """
    changed = 0
    for param in model.parameters():
        if param.dim() == 2 and type(param.data) is torch.Tensor and param.is_contiguous():
            param.data = param.data.t().contiguous().t()
            changed += 1
    return changed


class ModelStepper:
    """Step a libai model through generation on this rank's pipeline stage.

    Args:
        model: a generative libai model, already pruned to this rank's stage under pp.
        pipe: the stage messenger (a single stage by default).
        amp_dtype: run the forward under ``torch.autocast`` with this dtype (e.g. bf16).
        decode_layout: store the weights column-major first (:func:`use_decode_layout`; it
            changes the model's parameter strides in place, not their values).
        static_cache: use a :class:`~libai.layers.kv_cache.StaticKVCache` by default (see the module
            docstring); a call's ``cache_implementation`` overrides it.
        compile: run the decode step through ``torch.compile`` by default (implies
            ``static_cache``); a call's ``compile`` overrides it.
        max_cache_len: default slots of the static cache (None: prompt + max_new_tokens).
        compile_mode: ``torch.compile`` mode; None: ``"reduce-overhead"`` (CUDA graphs) on
            CUDA, ``"default"`` elsewhere.
    """

    #: ``generate`` may pass ``cache_implementation`` / ``max_cache_len`` / ``compile``
    supports_static_cache = True

    def __init__(
        self,
        model: nn.Module,
        pipe: StagePipe | None = None,
        amp_dtype=None,
        decode_layout: bool = False,
        *,
        static_cache: bool = False,
        compile: bool = False,
        max_cache_len: int | None = None,
        compile_mode: str | None = None,
    ):
        if not isinstance(model, Generator):
            raise TypeError(
                f"{type(model).__name__} cannot generate text: text generation supports "
                "decoder-only (GPT-2, Llama, Qwen2) and encoder-decoder (T5, mT5) models"
            )
        self.model, self.pipe, self.amp_dtype = model, pipe or StagePipe(), amp_dtype
        if decode_layout:
            use_decode_layout(model)
        self.is_encoder_decoder = isinstance(model, EncoderDecoderGenerator)
        self.is_last = self.pipe.is_last
        hparams = model_libai_cfg(model)
        self.vocab_size = hparams["vocab_size"]
        #: longest sequence the model can position (None: relative positions, no limit)
        self.max_positions = hparams.get("max_seq_length") or hparams.get("max_position_embeddings")
        if self.is_encoder_decoder:
            self.max_positions = None
        self.static_cache, self.compile, self.max_cache_len = static_cache, compile, max_cache_len
        if compile_mode is None:
            compile_mode = "reduce-overhead" if self.pipe.device.type == "cuda" else "default"
        self.compile_mode = compile_mode
        self.cache: KVCache | None = None
        self._static: StaticKVCache | None = None  # kept for the next generation
        self._compiled = None  # _compile(model.decode_stage), built on first use
        self._compiled_greedy = None  # _compile(_greedy_step), built on first use
        self._greedy_buffers: tuple | None = None  # its device state, kept with the cache
        self.compiled_step = False

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.pipe.device.type, dtype=self.amp_dtype)

    def start(
        self,
        input_ids,
        attention_mask,
        expand: int,
        max_length: int,
        *,
        cache_implementation: str | None = None,
        max_cache_len: int | None = None,
        compile: bool | None = None,
    ) -> None:
        """Begin a generation of ``max_length`` positions (prompt + new tokens): a fresh
        cache (see the module docstring for the options); encoder-decoder models encode
        ``input_ids`` (each row repeated ``expand`` times) once, here."""
        static, self.compiled_step = self._cache_kind(cache_implementation, compile)
        if max_cache_len is not None and not static:
            raise ValueError("max_cache_len applies to cache_implementation='static' only")
        rows = input_ids.shape[0] * expand
        self.cached = 0
        self._greedy_ready = False  # greedy_next loads its buffers at its first decode step
        self.padded = attention_mask is not None and not bool(attention_mask.all())
        if static:
            self.cache = self._static_cache(rows, max_cache_len or self.max_cache_len, max_length)
            self.slot_mask = None
            if not self.is_encoder_decoder:  # padding of every slot: the prompt's, then ones
                self.slot_mask = torch.ones(
                    rows, self.cache.max_length, dtype=torch.bool, device=input_ids.device
                )
                prompt = attention_mask.repeat_interleave(expand, dim=0)
                self.slot_mask[:, : prompt.shape[1]] = prompt.bool()
        else:
            self.cache = KVCache(max_length)
        if not self.is_encoder_decoder:
            return
        ids = input_ids.repeat_interleave(expand, dim=0)
        mask = attention_mask.repeat_interleave(expand, dim=0)
        with self._autocast():
            states = self.pipe.run(self.model.encode_stage, ids, mask)
        if self.pipe.num_stages > 1:  # every decoder stage attends to it
            (states,) = self.pipe.broadcast_from_last((states,))
        self.encoder_states, self.encoder_mask = states, mask if self.padded else None

    def _cache_kind(self, cache_implementation, compile) -> tuple[bool, bool]:
        """``(static, compiled)`` of a call's settings over this stepper's defaults."""
        if cache_implementation not in (None, "dynamic", "static"):
            raise ValueError(
                f"cache_implementation must be 'dynamic' or 'static', got {cache_implementation!r}"
            )
        if cache_implementation == "dynamic":
            if compile:
                raise ValueError(
                    "compile=True needs cache_implementation='static': a compiled decode step "
                    "needs the fixed shapes of the static cache"
                )
            return False, False
        compiled = self.compile if compile is None else compile
        return cache_implementation == "static" or self.static_cache or compiled, compiled

    def _static_cache(self, rows: int, length: int | None, needed: int) -> StaticKVCache:
        """The static cache of the last generation when it fits (same rows and length),
        emptied; else a new one."""
        length = needed if length is None else length
        if length < needed:
            raise ValueError(
                f"the static KV cache holds max_cache_len={length} positions but the prompt "
                f"plus max_new_tokens need {needed}; raise max_cache_len or lower "
                "max_new_tokens"
            )
        cache = self._static
        if cache is None or cache.max_length != length or self._static_rows != rows:
            cache, self._static_rows = StaticKVCache(length), rows
        cache.reset()
        self._static = cache
        return cache

    def _compile(self, fn):
        """``torch.compile`` of a decode step in this stepper's mode; under CUDA graphs
        wrapped once so that its outputs survive the next replay (:func:`_fresh_outputs`)."""
        compiled = torch.compile(fn, mode=self.compile_mode, dynamic=False)
        return _fresh_outputs(compiled) if self.compile_mode == "reduce-overhead" else compiled

    def _decode_fn(self, new_tokens: int):
        """``model.decode_stage`` or its compiled version (single-token steps after the
        first, once the cache holds its buffers)."""
        if not (self.compiled_step and new_tokens == 1 and self.cached > 0):
            return self.model.decode_stage
        if self._compiled is None:
            self._compiled = self._compile(self.model.decode_stage)
        return self._compiled

    def next_logits(self, sequences: torch.Tensor, attention_mask: torch.Tensor):
        """Float32 logits ``[B, vocab]`` of the token after ``sequences`` on the last stage
        (None elsewhere), feeding only the tokens the cache has not seen."""
        new = _dense(sequences[:, self.cached :])
        decode = self._decode_fn(new.shape[1])
        static = isinstance(self.cache, StaticKVCache)
        if static:  # the slots this step writes and the mask of every layer, computed once
            self.cache.step(self.cached, new.shape[1], self.slot_mask, device=new.device)
        if self.is_encoder_decoder:
            stage = functools.partial(
                decode,
                cache=self.cache,
                encoder_states=self.encoder_states,
                encoder_mask=self.encoder_mask,
            )
        else:
            # left padding: a token's position counts the real tokens before it
            positions = _dense((attention_mask.cumsum(-1) - 1).clamp_(min=0)[:, self.cached :])
            mask = attention_mask if self.padded and not static else None

            def stage(x):
                return decode(x, mask, positions, self.cache)

        with self._autocast():
            logits = self.pipe.run(stage, new)
        self.cached = sequences.shape[1]
        return None if logits is None else logits.float()

    def fuses_greedy(self, config, processors) -> bool:
        """Whether :meth:`greedy_next` picks this generation's tokens in the compiled step:
        greedy search without logits processors (``processors``: the search's list), the
        compiled static cache, a decoder-only model, one pipeline stage."""
        return (
            self.compiled_step
            and isinstance(self.cache, StaticKVCache)
            and not self.is_encoder_decoder
            and self.pipe.num_stages == 1
            and not config.do_sample
            and not processors
        )

    def greedy_next(self, sequences: torch.Tensor, attention_mask: torch.Tensor):
        """The greedy next token ``[B]`` after ``sequences`` (when :meth:`fuses_greedy`): the
        prompt step eagerly, then each single-token step as one compiled call that writes
        the cache, advances the slot and positions on device and takes the argmax."""
        if self.cached == 0 or sequences.shape[1] - self.cached != 1:
            return self.next_logits(sequences, attention_mask).argmax(dim=-1)
        cursor, positions, padding, keep = self._greedy_state(attention_mask)
        # the attention layers read the slot and the mask from the cache: point it at the
        # buffers the compiled step fills in place
        self.cache.cache_position, self.cache.keep = cursor, keep
        if self._compiled_greedy is None:
            self._compiled_greedy = self._compile(self._greedy_step)
        with self._autocast():
            tokens = self._compiled_greedy(
                _dense(sequences[:, -1:]), cursor, positions, padding, keep
            )
        self.cached = sequences.shape[1]
        self.cache.seen = self.cached
        return tokens

    def _greedy_state(self, attention_mask: torch.Tensor) -> tuple:
        """``(slot [1], positions [B, 1], padding [B, slots], keep [B, 1, 1, slots])``: device
        buffers kept with the static cache (a CUDA graph replays on their addresses), loaded
        at the first decode step of a generation from the Python-side state."""
        cache = self.cache
        if self._greedy_buffers is None or self._greedy_buffers[0] is not cache:
            rows, device = attention_mask.shape[0], attention_mask.device
            buffers = (
                torch.zeros(1, dtype=torch.long, device=device),
                torch.zeros(rows, 1, dtype=torch.long, device=device),
                torch.ones(rows, cache.max_length, dtype=torch.bool, device=device),
                torch.ones(rows, 1, 1, cache.max_length, dtype=torch.bool, device=device),
            )
            if device.type == "cuda":
                for t in buffers:
                    torch._dynamo.mark_static_address(t)
            self._greedy_buffers = (cache, *buffers)
        cursor, positions, padding, keep = self._greedy_buffers[1:]
        if not self._greedy_ready:
            cursor.fill_(self.cached)
            # a token's position counts the real tokens before it (left padding)
            positions.copy_(attention_mask[:, : self.cached].sum(-1, keepdim=True))
            padding.copy_(self.slot_mask)
            self._greedy_ready = True
        return cursor, positions, padding, keep

    def _greedy_step(self, tokens, cursor, positions, padding, keep):
        """One single-token greedy step, traced whole: the mask of slot ``cursor`` (slots up
        to it that are not padding), the decode stage writing the cache at ``cursor``, the
        argmax; then ``cursor`` and ``positions`` move on by one, in place."""
        slots = torch.arange(keep.shape[-1], device=keep.device)
        keep.copy_((slots <= cursor)[None, None, None, :] & padding[:, None, None, :])
        logits = self.model.decode_stage(tokens, None, positions, self.cache)
        cursor.add_(1)
        positions.add_(1)
        return logits.float().argmax(dim=-1)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search: keep cache rows ``beam_idx``."""
        self.cache.reorder(beam_idx)
        if isinstance(self.cache, StaticKVCache) and self.slot_mask is not None:
            self.slot_mask = self.slot_mask.index_select(0, beam_idx)

    def share(self, tensors: tuple) -> tuple:
        """The last stage's ``tensors`` on every stage."""
        return self.pipe.broadcast_from_last(tensors)


def _dense(view: torch.Tensor) -> torch.Tensor:
    """A copy with standard strides: a column of the growing sequences has a new row stride
    every step (even at batch 1, where ``contiguous()`` keeps it), which a compiled step
    would guard on and recompile for."""
    return view.clone(memory_format=torch.contiguous_format)


def _fresh_outputs(compiled):
    """Call a CUDA-graph step so that its outputs survive the next replay: mark a new step
    (the previous outputs are dead) and copy what it returns."""

    def call(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(None if t is None else t.clone() for t in out)
        return out.clone()

    return call
