"""Transformers' keyword names on libai's ``forward`` methods.

The rule, for every model in :mod:`libai.models`: a keyword that transformers uses is
accepted wherever libai's ``forward`` spells the same input differently, so
``model(**tokenizer(texts, return_tensors="pt"))`` works on a loaded model. The table
:data:`HF_KEYWORDS` is the whole rule; a transformers name applies to a ``forward`` only
when that ``forward`` has no parameter of that name and does have the libai counterpart
(``input_ids`` means ``encoder_input_ids`` on T5, and stays ``input_ids`` on BERT).
Giving both spellings of one input is a ``TypeError``.
"""

from __future__ import annotations

import functools
import inspect

#: transformers' keyword -> libai's keyword for the same input
HF_KEYWORDS = {
    "token_type_ids": "tokentype_ids",  # BERT, RoBERTa
    "next_sentence_label": "ns_labels",  # BertForPreTraining
    "labels": "lm_labels",  # BertForPreTraining, RobertaForPreTraining, T5ForPreTraining
    "input_ids": "encoder_input_ids",  # T5 / mT5
    "attention_mask": "encoder_attn_mask",  # T5 / mT5
    "decoder_attention_mask": "decoder_attn_mask",  # T5 / mT5
    "pixel_values": "images",  # ViT
}


def accepts_hf_keywords(forward):
    """Decorate a model's ``forward`` so it also takes transformers' keyword names.

    The aliases are fixed at decoration time from ``forward``'s signature (see the module
    docstring); a call without any of them goes straight through.
    """
    params = inspect.signature(forward).parameters
    aliases = {
        hf: libai for hf, libai in HF_KEYWORDS.items() if hf not in params and libai in params
    }
    if not aliases:
        return forward

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if kwargs and not aliases.keys().isdisjoint(kwargs):
            for hf, libai in aliases.items():
                if hf in kwargs:
                    if libai in kwargs:
                        raise TypeError(
                            f"{type(self).__name__}.forward got both {hf!r} (transformers' "
                            f"name) and {libai!r} (libai's name) for the same input; give one"
                        )
                    kwargs[libai] = kwargs.pop(hf)
        return forward(self, *args, **kwargs)

    wrapper.hf_keywords = dict(aliases)
    return wrapper
