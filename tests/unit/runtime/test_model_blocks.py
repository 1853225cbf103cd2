"""Which modules of a model are its blocks (:func:`libai.runtime.blocks.model_blocks`): the
units activation checkpointing, ``torch.compile`` and ZeRO-3 act on.

Each case is a model whose blocks are known from its construction: libai's
``TransformerLayer`` s, the modules a Hugging Face model names in ``_no_split_modules``, the
items of a stack of one class (the outermost stack when stacks nest), and otherwise the
direct children that hold parameters.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from layer_helpers import single_process  # noqa: F401  (autouse fixture)
from master_weights_cases import GPT
from torch import nn

from libai.models import GPTForPreTraining
from libai.runtime.blocks import enable_activation_checkpointing, model_blocks


class Block(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class OtherBlock(Block):
    """A block of another class (a subclass is another class too)."""


class Net(nn.Module):
    """An embedding-like input layer, ``layers`` (a container or a module) and a head."""

    def __init__(self, layers: nn.Module):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.layers = layers
        self.head = nn.Linear(4, 2)


def test_libai_models_give_their_transformer_layers():
    model = GPTForPreTraining(**GPT)
    blocks = model_blocks(model)
    assert len(blocks) == GPT["hidden_layers"]
    assert [b.layer_idx for b in blocks] == list(range(GPT["hidden_layers"]))


def test_hugging_face_models_give_the_modules_their_no_split_list_names():
    config = transformers.GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    model = transformers.GPT2LMHeadModel(config)
    assert model_blocks(model) == list(model.transformer.h)


@pytest.mark.parametrize("count", [2, 3])
def test_a_list_of_one_class_is_a_stack(count):
    layers = nn.ModuleList(Block() for _ in range(count))
    assert model_blocks(Net(layers)) == list(layers)


def test_a_dict_of_one_class_is_a_stack():
    layers = nn.ModuleDict({"a": Block(), "b": Block()})
    assert model_blocks(Net(layers)) == [layers["a"], layers["b"]]


def test_stacks_inside_a_stack_are_not_blocks_of_their_own():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.ModuleList(Block() for _ in range(2))

    layers = nn.ModuleList(Outer() for _ in range(2))
    assert model_blocks(Net(layers)) == list(layers)


@pytest.mark.parametrize(
    "layers",
    [
        pytest.param(lambda: nn.ModuleList([Block()]), id="one item"),
        pytest.param(lambda: nn.ModuleList([Block(), OtherBlock()]), id="two classes"),
        pytest.param(lambda: nn.ModuleList([nn.ReLU(), nn.ReLU()]), id="no parameters"),
    ],
)
def test_other_containers_are_not_stacks_and_the_children_with_parameters_are_the_blocks(layers):
    net = Net(layers())
    # the children that hold parameters, in order; the ReLU holds none
    want = [m for m in (net.inp, net.layers, net.head) if next(m.parameters(), None) is not None]
    assert model_blocks(net) == want


def test_a_model_with_no_child_holding_parameters_has_no_blocks():
    class Bare(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))
            self.act = nn.ReLU()

    assert model_blocks(Bare()) == []
    with pytest.raises(ValueError, match="train.activation_checkpoint: Bare has no"):
        enable_activation_checkpointing(Bare())


def test_checkpointed_stack_blocks_give_the_gradients_of_the_plain_model():
    """Full recomputation of a user's stack: the same loss and gradients as without it, and
    each block's forward really runs twice (once more in backward)."""
    torch.manual_seed(0)
    plain = Net(nn.ModuleList(Block() for _ in range(3)))
    recomputed = Net(nn.ModuleList(Block() for _ in range(3)))
    recomputed.load_state_dict(plain.state_dict())
    assert enable_activation_checkpointing(recomputed, "full") == 3
    calls = []
    for block in recomputed.layers:
        block.fc.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(5, 4)

    def loss_of(net):
        h = net.act(net.inp(x))
        for block in net.layers:
            h = block(h)
        return net.head(h).square().mean()

    loss_of(plain).backward()
    loss_of(recomputed).backward()
    assert len(calls) == 6
    for (name, p), q in zip(plain.named_parameters(), recomputed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


def test_no_recompute_layers_count_blocks_by_position_without_a_layer_index():
    """FleetX's ``no_recompute_layers`` on blocks that carry no ``layer_idx`` (a user's
    stack): the block's position is its index, so block 1 keeps its activations (its
    forward runs once) while blocks 0 and 2 run again in backward."""
    net = Net(nn.ModuleList(Block() for _ in range(3)))
    assert not any(hasattr(block, "layer_idx") for block in net.layers)
    assert enable_activation_checkpointing(net, "full", no_recompute_layers=[1]) == 2
    calls = {i: 0 for i in range(3)}
    for i, block in enumerate(net.layers):
        block.fc.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    h = net.act(net.inp(torch.randn(5, 4)))
    for block in net.layers:
        h = block(h)
    net.head(h).square().mean().backward()
    assert calls == {0: 2, 1: 1, 2: 2}
