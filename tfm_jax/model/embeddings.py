"""§3.4 shared token embedding (x sqrt(d_model), tied pre-softmax projection), §3.5 positions."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfm_jax.model import matmul

Array = jax.Array


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """§3.5 PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...). -> [max_len, d]."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]  # [max_len, 1]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # [1, ceil(d/2)]
    angle = pos / np.power(10000.0, two_i / d_model)  # [max_len, ceil(d/2)]
    table = np.zeros((max_len, d_model), dtype=np.float32)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return table


class SharedEmbedding(nn.Module):
    """§3.4 One matrix for source tokens, target tokens and the pre-softmax linear layer."""

    vocab_size: int
    d_model: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    product: str = "auto"  # matmul.einsum's bf16 product (model/matmul.py)

    def setup(self):
        # std d_model^-0.5 so that the embedding times sqrt(d_model) has unit scale, as in
        # tensor2tensor; the paper does not state its initializer.
        init = nn.with_logical_partitioning(
            nn.initializers.normal(stddev=self.d_model**-0.5), ("vocab", "embed")
        )
        self.embedding = self.param(
            "embedding", init, (self.vocab_size, self.d_model), self.param_dtype
        )

    def __call__(self, ids: Array) -> Array:
        """[b, l] int -> [b, l, d_model], multiplied by sqrt(d_model) (§3.4)."""
        emb = jnp.take(jnp.asarray(self.embedding, self.dtype), ids, axis=0)
        return emb * jnp.sqrt(jnp.asarray(self.d_model, self.dtype))

    def attend(self, x: Array) -> Array:
        """Pre-softmax projection with the same (unscaled) matrix: [b, l, d] -> [b, l, vocab].

        The logits are float32 whatever the compute dtype: the softmax and loss run in float32,
        and a bf16 round trip of the [b, l, vocab] logits would cost memory traffic and precision.
        """
        return matmul.einsum(
            "bld,vd->blv", x, self.embedding, self.dtype, jnp.float32, product=self.product
        )


class PositionalEncoding(nn.Module):
    """§3.5 adds position information: fixed sinusoids (paper) or learned (Table 3 row E)."""

    d_model: int
    max_len: int
    kind: str = "sinusoidal"  # §3.5; "learned" is Table 3 row (E)
    init_std: float = 0.02  # "learned": the table's initial std
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, positions: Array | None = None, *, decode: bool = False) -> Array:
        """x [b, l, d] + PE[positions]; positions [b, l] (packed rows) or 0..l-1.

        decode=True: one position per call, counted in the "cache" collection (init() creates the
        counter at 0 from a full-length input).
        """
        if self.kind == "sinusoidal":
            table = jnp.asarray(sinusoidal_table(self.max_len, self.d_model))
        else:  # "learned" (model.positional is checked by tfm_jax/config/validate.py)
            init = nn.with_logical_partitioning(
                nn.initializers.normal(stddev=self.init_std), (None, "embed")
            )
            table = self.param(
                "pos_embedding", init, (self.max_len, self.d_model), self.param_dtype
            )
        if decode:
            initialized = self.has_variable("cache", "position")
            counter = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
            if initialized:
                positions = jnp.full((x.shape[0], 1), counter.value, jnp.int32)
                counter.value = counter.value + 1
        if positions is None:
            pe = table[None, : x.shape[1]]  # [1, l, d]
        else:
            pe = jnp.take(table, positions, axis=0)  # [b, l, d]
        return x + pe.astype(self.dtype)
