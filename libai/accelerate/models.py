"""Which model a task runs: the libai zoo model of the architecture (every dp x tp x pp
layout; weights loaded from and saved back to the Hugging Face directory), or the
transformers module itself (data parallel, ZeRO, AMP, recompute and compile).

Both present the libai model contract to the runner: ``model(**batch)`` returns a dict whose
``*loss*`` keys are summed. Batches are built in transformers' names (``token_type_ids``,
``labels`` unshifted); :func:`zoo_batch` renames them for the zoo models.
"""

from __future__ import annotations

import json
import logging
import os

import torch
from torch import nn

from libai import dist

logger = logging.getLogger(__name__)

__all__ = [
    "HFTaskModel",
    "ZOO",
    "build_model",
    "hf_pretraining_batch",
    "model_type_of",
    "save_pretrained",
    "zoo_batch",
]

#: (task, Hugging Face model_type) -> the libai class; ``None`` entries are refused with a
#: message (the zoo has the architecture but not the head)
ZOO = {
    ("sequence_classification", "bert"): "BertForClassification",
    ("sequence_classification", "roberta"): "RobertaForClassification",
    ("masked_lm", "roberta"): "RobertaForPreTraining",
    ("causal_lm", "gpt2"): "GPTForPreTraining",
    ("causal_lm", "llama"): "LlamaForCausalLM",
    ("causal_lm", "qwen2"): "LlamaForCausalLM",
    ("causal_lm", "qwen3"): "LlamaForCausalLM",
    ("causal_lm", "mixtral"): "LlamaForCausalLM",
    ("causal_lm", "qwen2_moe"): "LlamaForCausalLM",
    ("causal_lm", "qwen3_moe"): "LlamaForCausalLM",
    ("causal_lm", "olmoe"): "LlamaForCausalLM",
    ("causal_lm", "deepseek_v3"): "LlamaForCausalLM",
    ("seq2seq_lm", "t5"): "T5ForPreTraining",
    ("seq2seq_lm", "mt5"): "T5ForPreTraining",
    ("pretraining", "gpt2"): "GPTForPreTraining",
}
ZOO_ARCHITECTURES = (
    "GPT-2",
    "BERT",
    "RoBERTa",
    "T5 / mT5",
    "Llama",
    "Qwen2",
    "Qwen3",
    "Mixtral",
    "Qwen2-MoE",
    "Qwen3-MoE",
    "OLMoE",
    "DeepSeek-V3",
)


def model_type_of(path: str | None) -> str | None:
    """``model_type`` of a Hugging Face directory's ``config.json`` (None without one)."""
    if not path:
        return None
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    with open(config, encoding="utf-8") as f:
        return json.load(f).get("model_type")


def zoo_class_name(task: str, model_type: str | None) -> str | None:
    return ZOO.get((task, model_type))


#: the zoo's Mixture-of-Experts families (expert parallel, --moe-aux-loss-coeff)
MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")


def check_layout(task: str, model_type: str | None, tp: int, pp: int, ep: int = 1) -> None:
    """Tensor / pipeline parallel only for the zoo's (task, architecture) pairs, expert
    parallel only for its Mixture-of-Experts ones; raises otherwise, naming them (no
    collective)."""
    if ep > 1 and (model_type not in MOE_MODEL_TYPES or zoo_class_name(task, model_type) is None):
        raise ValueError(
            f"--expert-model-parallel-size {ep} splits the experts of a Mixture-of-Experts "
            f"model of libai's zoo ({', '.join(MOE_MODEL_TYPES)}, task causal_lm); {task} on "
            f"model_type {model_type!r} has none. Use --expert-model-parallel-size 1"
        )
    if (tp > 1 or pp > 1) and zoo_class_name(task, model_type) is None:
        pairs = ", ".join(f"{t} on {m}" for t, m in sorted(ZOO))
        raise ValueError(
            f"--tensor-model-parallel-size {tp} / --pipeline-model-parallel-size {pp} need a "
            f"model from libai's zoo ({', '.join(ZOO_ARCHITECTURES)}) with the task's head; "
            f"{task} on model_type {model_type!r} is not one. Supported: {pairs}. This model "
            "runs data parallel, with ZeRO, mixed precision, recompute and compile"
        )


class HFTaskModel(nn.Module):
    """A transformers model under the libai model contract (``model(**batch)`` -> a dict
    with ``loss`` and the model's other tensors). ``hf`` is the module itself."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, **batch) -> dict:
        out = self.hf(**batch)
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def zoo_batch(model: nn.Module, batch: dict, task: str) -> dict:
    """A transformers-style batch of ``task`` in the names and conventions of libai's
    ``model`` (pretraining batches are libai's already)."""
    if task == "pretraining":
        return batch
    name = type(model).__name__
    out = dict(batch)
    if "token_type_ids" in out:
        out["tokentype_ids"] = out.pop("token_type_ids")
    if name == "GPTForPreTraining":
        # transformers' labels are the inputs (shifted inside); libai's GPT takes next tokens
        labels = out["labels"]
        out["labels"] = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    elif name == "RobertaForPreTraining":
        labels = out.pop("labels")
        out["lm_labels"], out["loss_mask"] = labels.clamp(min=0), (labels != -100).long()
    elif name == "T5ForPreTraining":
        labels = out.pop("labels")
        out["encoder_input_ids"] = out.pop("input_ids")
        out["encoder_attn_mask"] = out.pop("attention_mask")
        # the decoder reads the labels shifted right behind T5's start token (pad, id 0)
        shifted = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
        out["decoder_input_ids"] = shifted.masked_fill(shifted == -100, 0)
        out["decoder_attn_mask"] = torch.ones_like(shifted)
        out["lm_labels"], out["loss_mask"] = labels.clamp(min=0), (labels != -100).long()
    return out


def hf_pretraining_batch(batch: dict) -> dict:
    """A pretraining batch (``labels`` = the next tokens) for a transformers causal LM, which
    shifts by itself: the inputs are their own labels."""
    return {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}


def build_model(
    task_name: str, args, auto_model: str, model_kwargs: dict
) -> tuple[nn.Module, bool]:
    """``(model, is_zoo)``: the zoo model of ``(task, model_type)`` loaded from
    ``--pretrained-model-name-or-path`` on the current mesh, else the transformers
    ``auto_model`` wrapped in :class:`HFTaskModel`."""
    path = args.pretrained_model_name_or_path
    name = zoo_class_name(task_name, model_type_of(path))
    if name is not None:
        import libai.models
        from libai.models.utils import load_huggingface

        overrides = {k: v for k, v in model_kwargs.items() if k == "num_labels"}
        model = load_huggingface(path, getattr(libai.models, name), **overrides)
        logger.info("%s on %s: libai's %s on the mesh", task_name, path, name)
        if getattr(args, "moe_aux_loss_coeff", None) is not None:
            set_moe_aux_loss_coeff(model, args.moe_aux_loss_coeff)
        return model, True
    if getattr(args, "moe_aux_loss_coeff", None) is not None:
        raise ValueError(
            f"--moe-aux-loss-coeff: {path} is not a Mixture-of-Experts model of the zoo "
            "(Mixtral, Qwen2-MoE); drop the flag"
        )
    if getattr(args, "lora_r", None) is not None:
        raise ValueError(
            f"--lora-r: {path} ({model_type_of(path)}, task {task_name}) runs as transformers' "
            "own module here; LoRA runs on the zoo's models (Llama, Qwen2, Qwen3, Mistral, "
            "Mixtral, Qwen-MoE, GPT-2) for causal LM fine-tuning"
        )
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cls = getattr(transformers, auto_model)
    hf = cls.from_pretrained(path, local_files_only=True, **model_kwargs)
    if dist.get_dist_util().device.type != "cpu":
        hf = hf.to(dist.get_dist_util().device)
    logger.info("%s on %s: transformers' %s", task_name, path, type(hf).__name__)
    return HFTaskModel(hf), False


def set_moe_aux_loss_coeff(model: nn.Module, coeff: float) -> None:
    """Megatron's ``--moe-aux-loss-coeff``: the load-balancing loss weight of every MoE layer
    of ``model`` (and of its config, which the Hugging Face export writes)."""
    import dataclasses

    from libai.layers import MoE

    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError(
            f"--moe-aux-loss-coeff: {type(model).__name__} has no Mixture-of-Experts layers; "
            "drop the flag"
        )
    for layer in layers:
        layer.config = dataclasses.replace(layer.config, aux_loss_coeff=float(coeff))
    for module in model.modules():
        cfg = module.__dict__.get("libai_cfg")
        if isinstance(cfg, dict) and cfg.get("moe"):
            cfg["moe"] = {**dict(cfg["moe"]), "aux_loss_coeff": float(coeff)}


def save_pretrained(
    model: nn.Module, path: str, tokenizer=None, lora=None, merge=False, base=None
) -> None:
    """Write ``model`` as a Hugging Face directory ``path`` (collective): a zoo model through
    its loader's export (which carries the source checkpoint's other settings), a transformers module with
    its full state dict (gathered from ZeRO-3 shards) by rank 0. The tokenizer's files go
    along. A LoRA run (``lora``, its :class:`~libai.models.lora.LoRAConfig`) writes its PEFT
    adapter directory (``base``: the base model's path it records), or with ``merge`` the
    merged model."""
    if lora is not None:
        from libai.models.lora import merge_lora
        from libai.models.lora_peft import save_peft_adapter

        if merge:
            merge_lora(model)
        else:
            save_peft_adapter(model, lora, path, base)
            if tokenizer is not None and dist.is_main_process():
                tokenizer.save_pretrained(path)
            dist.synchronize()
            return
    if isinstance(model, HFTaskModel):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model.hf, options=options)
        if dist.is_main_process():
            model.hf.save_pretrained(path, state_dict=state)
    else:
        from libai.models.utils import save_huggingface

        save_huggingface(model, path)
    if tokenizer is not None and dist.is_main_process():
        tokenizer.save_pretrained(path)
    dist.synchronize()
