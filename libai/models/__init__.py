"""Model zoo built from libai.layers."""

from libai.models.bert_model import BertForClassification, BertForPreTraining, BertModel
from libai.models.gpt_model import GPTForPreTraining, GPTModel
from libai.models.llama_model import LlamaForCausalLM, LlamaModel
from libai.models.roberta_model import (
    RobertaForCausalLM,
    RobertaForClassification,
    RobertaForPreTraining,
    RobertaModel,
)
from libai.models.swin import SwinTransformer, SwinTransformerV2
from libai.models.t5_megatron import MegatronT5ForPreTraining, MegatronT5Model
from libai.models.t5_model import T5ForPreTraining, T5Model
from libai.models.vit import VisionTransformer

__all__ = [
    "BertForClassification",
    "BertForPreTraining",
    "BertModel",
    "GPTForPreTraining",
    "GPTModel",
    "LlamaForCausalLM",
    "LlamaModel",
    "MegatronT5ForPreTraining",
    "MegatronT5Model",
    "RobertaForCausalLM",
    "RobertaForClassification",
    "RobertaForPreTraining",
    "RobertaModel",
    "SwinTransformer",
    "SwinTransformerV2",
    "T5ForPreTraining",
    "T5Model",
    "VisionTransformer",
]
