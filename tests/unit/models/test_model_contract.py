"""The model contract (libai.models.contract): the zoo's models satisfy the protocols the
runtime and generation check, and a model that lacks a member is named with what it lacks."""

from __future__ import annotations

from torch import nn

from libai.models import (
    BertForClassification,
    BertForPreTraining,
    GPTForPreTraining,
    LlamaForCausalLM,
    RobertaForClassification,
    RobertaForPreTraining,
    SwinTransformer,
    SwinTransformerV2,
    T5ForPreTraining,
    VisionTransformer,
)
from libai.models.contract import (
    EncoderDecoderGenerator,
    Generator,
    PipelineModel,
    missing_pipeline_members,
)

ZOO = [
    BertForClassification,
    BertForPreTraining,
    GPTForPreTraining,
    LlamaForCausalLM,
    RobertaForClassification,
    RobertaForPreTraining,
    SwinTransformer,
    SwinTransformerV2,
    T5ForPreTraining,
    VisionTransformer,
]


def test_the_zoo_runs_under_pipeline_parallel_by_contract():
    for cls in ZOO:
        assert issubclass(cls, PipelineModel), cls.__name__
        stand_in = cls.__new__(cls)  # the members are class attributes and methods
        assert missing_pipeline_members(stand_in) == [], cls.__name__


def test_generation_capabilities():
    assert issubclass(GPTForPreTraining, Generator)
    assert issubclass(LlamaForCausalLM, Generator)
    assert not issubclass(GPTForPreTraining, EncoderDecoderGenerator)
    assert issubclass(T5ForPreTraining, EncoderDecoderGenerator)
    assert not issubclass(BertForPreTraining, Generator)


def test_what_a_model_lacks_is_named():
    class Plain(nn.Module):
        def forward(self, x):
            return {"loss": x.sum()}

    assert missing_pipeline_members(Plain()) == [
        "pipeline_forward / pipeline_loss",
        "pipeline_input_key or pipeline_inputs(batch)",
        "pipeline_target_key or pipeline_target(batch)",
    ]

    class Half(Plain):
        pipeline_input_key = "x"

        def pipeline_forward(self, x):
            return x

        def pipeline_loss(self, output, target):
            return output.sum()

    assert missing_pipeline_members(Half()) == ["pipeline_target_key or pipeline_target(batch)"]
