"""LiBai's ``graph`` namespace. Here ``graph.enabled`` compiles the model with
``torch.compile`` (OneFlow's nn.Graph has no PyTorch equivalent beyond that)."""

graph = dict(
    enabled=False,
    # LiBai's debug level for graph building; -1 = quiet
    debug=-1,
)
