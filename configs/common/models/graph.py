"""LiBai's ``graph`` namespace. Here ``graph.enabled`` compiles every Transformer block with
``torch.compile`` (OneFlow's nn.Graph has no PyTorch equivalent beyond that): ``None``
(default) compiles on CUDA and not on CPU, ``True`` / ``False`` force it."""

graph = dict(
    enabled=None,
    # LiBai's debug level for graph building; -1 = quiet
    debug=-1,
)
