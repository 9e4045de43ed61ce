"""The Transformer of §3 as plain Flax modules: attention, embeddings, the encoder-decoder stack,
and the precision policy of their matrix products (matmul.py)."""
