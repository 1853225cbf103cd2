"""The tiny GPT the mixed-precision O2 tests train (one process and the dist script alike)."""

GPT = dict(
    hidden_layers=2,
    vocab_size=64,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
    embedding_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    output_dropout_prob=0.0,
)
