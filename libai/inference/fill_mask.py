"""``FillMaskPipeline``: the most likely tokens for each mask token of a text, from a
masked-LM model (``BertForPreTraining``, ``RobertaForPreTraining``), shaped like
``transformers.pipeline("fill-mask")``.

Usage (every rank runs the same script; rank 0 gets the result, the others ``None``)::

    pipe = FillMaskPipeline(model_path="path/to/hf_bert", mode="huggingface",
                            pipeline_parallel=2)
    pipe("Paris is the [MASK] of France.", top_k=3)
    # [{"score": 0.9, "token": 3007, "token_str": "capital", "sequence": "paris is ..."}, ...]
"""

from __future__ import annotations

import torch

from libai.inference.basic import BasePipeline
from libai.inference.classification_utils import check_top_k
from libai.inference.text_inputs import encode_texts
from libai.layers import LMLogits


class FillMaskPipeline(BasePipeline):
    """Fill the mask token(s) of texts. Call parameter ``top_k`` (default 5): predictions per
    mask. Each text gives a list of ``{"score", "token", "token_str", "sequence"}``, or a
    list of such lists when it has several masks; a single text (or a list of one) gives its
    own result, as in ``transformers``.

    Raises ``ValueError`` for a text without the tokenizer's mask token.
    """

    def _parse_parameters(self, **params):
        pre, fwd, post = self.split_parameters(params, postprocess=("top_k",))
        if "top_k" in post:
            check_top_k(post["top_k"])
        return pre, fwd, post

    def _lm_logits(self) -> LMLogits:
        """The masked-LM output layer (on the last pipeline stage)."""
        for module in self.model.modules():
            if isinstance(module, LMLogits):
                return module
        raise TypeError(f"{type(self.model).__name__} has no masked-LM head (LMLogits)")

    def preprocess(self, inputs: list, **params) -> dict:
        mask = getattr(self.tokenizer, "mask_token_id", None)
        if mask is None:
            raise ValueError(f"the tokenizer {self.tokenizer!r} has no mask token")
        batch = encode_texts(self.tokenizer, inputs, self.device)
        for text, ids in zip(inputs, batch["input_ids"]):
            if not bool((ids == mask).any()):
                raise ValueError(
                    f"no mask token ({self.tokenizer.mask_token}) found in the input {text!r}"
                )
        return batch

    def forward(self, model_inputs: dict, **params):
        out = self.run_model(model_inputs)
        if out is None:
            return None
        scores = out[0] if isinstance(out, tuple) else out  # BERT: (mlm, next sentence)
        logits = self._lm_logits().gather(scores)  # [S(0), S(-1)] -> [S(0), B]: full vocab
        mask = model_inputs["input_ids"] == self.tokenizer.mask_token_id
        return {
            "input_ids": model_inputs["input_ids"].cpu(),
            "attention_mask": model_inputs["attention_mask"].cpu(),
            "mask_logits": [logits[i][mask[i]].float().cpu() for i in range(len(mask))],
        }

    def postprocess(self, outputs: dict, top_k: int = 5) -> list:
        tok = self.tokenizer
        results = []
        for ids, keep, logits in zip(
            outputs["input_ids"], outputs["attention_mask"], outputs["mask_logits"]
        ):
            ids = ids[keep.bool()]
            positions = torch.nonzero(ids == tok.mask_token_id).squeeze(-1).tolist()
            probs = logits.softmax(dim=-1)
            values, predictions = probs.topk(min(top_k, probs.shape[-1]))
            single_mask = len(positions) == 1
            per_mask = []
            for pos, vals, preds in zip(positions, values.tolist(), predictions.tolist()):
                row = []
                for score, token in zip(vals, preds):
                    filled = ids.clone()
                    filled[pos] = token
                    if tok.pad_token_id is not None:
                        filled = filled[filled != tok.pad_token_id]
                    row.append(
                        {
                            "score": score,
                            "token": token,
                            "token_str": tok.decode([token]),
                            "sequence": tok.decode(filled, skip_special_tokens=single_mask),
                        }
                    )
                per_mask.append(row)
            results.append(per_mask[0] if single_mask else per_mask)
        return results

    def _unbatch(self, results: list, single: bool, **call_params):
        return results[0] if single or len(results) == 1 else results
