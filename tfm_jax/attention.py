"""§3.2 Scaled dot-product attention, multi-head attention, masks and the decoding cache."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Initializer = Callable[..., Array]


def padding_mask(query_valid: Array, key_valid: Array) -> Array:
    """Attend only from real queries to real keys. [b, q], [b, k] bool -> [b, 1, q, k]."""
    return (query_valid[:, None, :, None] & key_valid[:, None, None, :]).astype(bool)


def causal_mask(length: int) -> Array:
    """Position i attends to positions <= i (lower triangle, diagonal included). -> [1, 1, q, k]."""
    idx = jnp.arange(length)
    return (idx[:, None] >= idx[None, :])[None, None]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
    """Packed rows: attend only within the same example. [b, q], [b, k] int -> [b, 1, q, k]."""
    return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
) -> tuple[Array, Array]:
    """§3.2.1 softmax(Q K^T / sqrt(d_k)) V over the key axis.

    query [b, q, h, d_k], key [b, k, h, d_k], value [b, k, h, d_v], mask broadcastable to
    [b, h, q, k] (True = attend). Returns (output [b, q, h, d_v], weights [b, h, q, k]).
    """
    d_k = query.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) / jnp.sqrt(d_k).astype(query.dtype)
    # The softmax runs in float32 even for bf16 compute: exp() of bf16 scores loses too much.
    scores = scores.astype(jnp.float32)
    if mask is not None:
        # A large finite negative, not -inf: a row with every key masked (an all-pad row) then
        # gets a uniform softmax instead of exp(-inf - -inf) = NaN; we zero it just below.
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)  # [b, h, q, k]; normalized over keys
    if mask is not None:
        weights = jnp.where(mask, weights, 0.0)  # fully masked rows -> zeros, never NaN
    if not deterministic and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    weights = weights.astype(value.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, value)  # [b, q, h, d_v]
    return out, weights


class MultiHeadAttention(nn.Module):
    """§3.2.2 Multi-head attention with d_k and d_v independent of d_model / h (Table 3 row B).

    W_Q, W_K: d_model x h*d_k; W_V: d_model x h*d_v; W_O: h*d_v x d_model; no biases (the paper's
    projections are plain matrices).
    """

    num_heads: int
    d_k: int
    d_v: int
    d_model: int
    attention_dropout: float = 0.0
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.xavier_uniform()
    sow_weights: bool = False

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        mask: Array | None,
        *,
        deterministic: bool = True,
        decode: bool = False,
    ) -> Array:
        """inputs_q [b, q, d_model], inputs_kv [b, k, d_model] -> [b, q, d_model].

        decode=True (self-attention only): inputs_q is one new position [b, 1, d_model]; keys and
        values of earlier positions come from the "cache" collection, which init() sized from a
        full-length input.
        """

        def proj(name: str, features: int, x: Array) -> Array:
            # [b, l, d_model] x [d_model, h, features] -> [b, l, h, features]. Plain params, not
            # nn.DenseGeneral: its flat-then-reshape init breaks 3-D logical partitioning.
            init = nn.with_logical_partitioning(self.kernel_init, ("embed", "heads", "kv"))
            kernel = self.param(
                name, init, (x.shape[-1], self.num_heads, features), self.param_dtype
            )
            return jnp.einsum("bld,dhf->blhf", x, jnp.asarray(kernel, self.dtype))

        query = proj("query", self.d_k, inputs_q)  # [b, q, h, d_k]
        key = proj("key", self.d_k, inputs_kv)  # [b, k, h, d_k]
        value = proj("value", self.d_v, inputs_kv)  # [b, k, h, d_v]
        query = nn.with_logical_constraint(query, ("batch", "length", "heads", "kv"))

        if decode:
            key, value, mask = self._update_cache(key, value, mask)

        dropout_rng = None
        if not deterministic and self.attention_dropout > 0.0:
            dropout_rng = self.make_rng("dropout")
        out, weights = dot_product_attention(
            query,
            key,
            value,
            mask,
            dropout_rate=self.attention_dropout,
            dropout_rng=dropout_rng,
            deterministic=deterministic,
        )
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", weights)
        out_init = nn.with_logical_partitioning(self.kernel_init, ("heads", "kv", "embed"))
        w_out = self.param("out", out_init, (self.num_heads, self.d_v, self.d_model), self.param_dtype)
        return jnp.einsum("bqhf,hfd->bqd", out, jnp.asarray(w_out, self.dtype))  # [b, q, d_model]

    def _update_cache(self, key: Array, value: Array, mask: Array | None):
        """Writes this step's key/value at cache_index and returns the whole cache.

        At init the key/value have the full decode length and only size the cache. Afterwards each
        call brings one position; the returned mask lets it see positions <= cache_index (causal).
        """
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return key, value, mask
        batch, max_len, heads, _ = cached_key.value.shape
        if key.shape[1] != 1:
            raise ValueError(f"decode=True takes one position at a time, got {key.shape[1]}")
        idx = cache_index.value
        zero = jnp.array(0, idx.dtype)
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (zero, idx, zero, zero))
        cached_value.value = jax.lax.dynamic_update_slice(
            cached_value.value, value, (zero, idx, zero, zero)
        )
        cache_index.value = idx + 1
        step_mask = (jnp.arange(max_len) <= idx)[None, None, None, :]  # [1, 1, 1, max_len]
        step_mask = jnp.broadcast_to(step_mask, (batch, 1, 1, max_len))
        return cached_key.value, cached_value.value, step_mask
