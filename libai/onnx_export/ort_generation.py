"""Generation on exported graphs: :class:`OrtStepper` runs the files written by
:func:`libai.onnx_export.export_onnx` in onnxruntime and implements the generation loop's
stepper protocol (``libai.inference.generation``), so that::

    generate(OrtStepper("out/model.onnx"), input_ids, attention_mask, max_new_tokens=20)

decodes like the PyTorch model. With the with-past graphs (``--with-past``) each step feeds
only the new tokens and keeps the key / value cache as numpy arrays; without them every step
re-runs the whole sequence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from libai.onnx_export.export import graph_paths


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


class OrtStepper:
    """Stepper over exported ONNX graphs (decoder-only or T5).

    Args:
        output: the ``--output`` path given at export (e.g. ``out/model.onnx``); the T5
            files (``encoder_model.onnx`` ...) and the with-past graph are found next to it.
        providers: onnxruntime execution providers (default CPU).
        session_options: an ``onnxruntime.SessionOptions``.
    """

    is_last = True  # this process computes the logits

    def __init__(self, output: str | Path, providers=None, session_options=None):
        import onnxruntime as ort

        providers = providers or ["CPUExecutionProvider"]

        def session(path: Path):
            return ort.InferenceSession(str(path), session_options, providers=providers)

        t5_paths = graph_paths(output, "t5", with_past=True)
        self.is_encoder_decoder = t5_paths[0].is_file()
        if self.is_encoder_decoder:
            encoder, decoder, with_past = t5_paths
            self.encoder = session(encoder)
        else:
            decoder, with_past = graph_paths(output, "causal_lm", with_past=True)
            if not decoder.is_file():
                raise FileNotFoundError(f"no exported graph at {decoder} (nor {t5_paths[0]})")
            self.encoder = None
        self.decoder = session(decoder)
        self.with_past = session(with_past) if with_past.is_file() else None
        self.decoder_outputs = [o.name for o in self.decoder.get_outputs()]
        self.with_past_outputs = (
            [o.name for o in self.with_past.get_outputs()] if self.with_past else []
        )
        # the cache needs the first graph's presents too
        if self.with_past is not None and len(self.decoder_outputs) == 1:
            self.with_past = None
        self._reset()

    def _reset(self) -> None:
        self.cache: dict[str, np.ndarray] = {}  # "past_key_values.*" name -> array
        self.cached_len = 0
        self.encoder_states = self.encoder_mask = None

    # ---- protocol ---------------------------------------------------------------------------
    def start(self, input_ids, attention_mask, expand: int = 1, max_length: int | None = None):
        """Reset the cache; for T5 encode the inputs repeated ``expand`` times per row."""
        self._reset()
        if self.is_encoder_decoder:
            ids = input_ids.repeat_interleave(expand, 0)
            mask = attention_mask.repeat_interleave(expand, 0)
            (self.encoder_states,) = self.encoder.run(
                None, {"input_ids": _np(ids), "attention_mask": _np(mask)}
            )
            self.encoder_mask = _np(mask)

    def next_logits(self, sequences, attention_mask) -> torch.FloatTensor:
        """Logits ``[B, vocab]`` of the token after ``sequences`` ``[B, cur]``."""
        use_past = self.with_past is not None and self.cached_len > 0
        new = sequences[:, self.cached_len :] if use_past else sequences
        if self.is_encoder_decoder:
            feed = {"input_ids": _np(new), "encoder_attention_mask": self.encoder_mask}
            if not use_past:
                feed["encoder_hidden_states"] = self.encoder_states
        else:
            positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            feed = {
                "input_ids": _np(new),
                "attention_mask": _np(attention_mask),
                "position_ids": _np(positions[:, sequences.shape[1] - new.shape[1] :]),
            }
        session, names = (
            (self.with_past, self.with_past_outputs)
            if use_past
            else (self.decoder, self.decoder_outputs)
        )
        if use_past:
            feed.update(self.cache)
        outputs = dict(zip(names, session.run(names, feed), strict=True))
        if self.with_past is not None:
            for name, value in outputs.items():
                if name.startswith("present."):
                    self.cache["past_key_values." + name[len("present.") :]] = value
            self.cached_len = sequences.shape[1]
        return torch.from_numpy(outputs["logits"][:, -1]).float()

    def reorder(self, beam_idx) -> None:
        """Reorder the cached rows (beam search)."""
        idx = _np(torch.as_tensor(beam_idx))
        self.cache = {k: np.take(v, idx, axis=0) for k, v in self.cache.items()}
        if self.encoder_states is not None:
            self.encoder_states = np.take(self.encoder_states, idx, axis=0)
            self.encoder_mask = np.take(self.encoder_mask, idx, axis=0)

    def share(self, tensors: tuple) -> tuple:
        """One process: nothing to share."""
        return tensors


__all__ = ["OrtStepper"]
