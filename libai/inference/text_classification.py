"""``TextClassificationPipeline``: label scores of texts from a sequence classifier
(``BertForClassification``), shaped like ``transformers.pipeline("text-classification")``.

Usage (every rank runs the same script; rank 0 gets the result, the others ``None``)::

    pipe = TextClassificationPipeline(model_path="path/to/hf_bert_classifier",
                                      mode="huggingface", tensor_parallel=2)
    pipe("a fine movie")            # [{"label": "POSITIVE", "score": 0.98}]
    pipe(["good", "bad"], top_k=2)  # one ranked list of 2 labels per text
"""

from __future__ import annotations

import torch

from libai.inference.basic import BasePipeline
from libai.inference.classification_utils import (
    apply_function,
    check_function,
    check_top_k,
    default_function,
    id2label,
    ranked_labels,
)
from libai.inference.text_inputs import encode_texts

_LEGACY = "legacy"  # top_k not given: one {"label", "score"} dict per text, as transformers


class TextClassificationPipeline(BasePipeline):
    """Classify texts. Call parameters:

    - ``top_k``: labels per text, ranked (``None``: all). Without it each text gets one
      ``{"label", "score"}`` dict (a single text: ``[dict]``), as in ``transformers``.
    - ``function_to_apply``: ``"softmax"``, ``"sigmoid"`` or ``"none"``; default from
      ``config.json`` (``problem_type``; sigmoid for one label, softmax otherwise).

    Labels come from ``config.json``'s ``id2label`` (``LABEL_{i}`` without one).
    """

    def _parse_parameters(self, **params):
        pre, fwd, post = self.split_parameters(params, postprocess=("top_k", "function_to_apply"))
        if "top_k" in post:
            check_top_k(post["top_k"], allow_none=True)
        if "function_to_apply" in post:
            post["function_to_apply"] = check_function(post["function_to_apply"])
        return pre, fwd, post

    def preprocess(self, inputs: list, **params) -> dict:
        return encode_texts(self.tokenizer, inputs, self.device)

    def forward(self, model_inputs: dict, **params):
        logits = self.run_model(model_inputs)  # classification heads give full logits
        return None if logits is None else logits.float().cpu()

    def postprocess(self, logits: torch.Tensor, top_k=_LEGACY, function_to_apply=None) -> list:
        num_labels = logits.shape[-1]
        function = function_to_apply or default_function(self.hf_config, num_labels)
        labels = id2label(self.hf_config, num_labels)
        results = []
        for row in logits.numpy():
            scores = apply_function(row, function)
            if top_k == _LEGACY:
                best = int(scores.argmax())
                results.append({"label": labels[best], "score": float(scores[best])})
            else:
                results.append(ranked_labels(scores, labels, top_k))
        return results

    def _unbatch(self, results: list, single: bool, **call_params):
        legacy = "top_k" not in {**self._postprocess_params, **call_params}
        if single:
            return [results[0]] if legacy else results[0]
        return results
