"""§3.2 Scaled dot-product attention, multi-head attention, masks and the decoding cache."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm_jax.model import matmul

Array = jax.Array
Initializer = Callable[..., Array]

# The decoding cache's variables that hold the encoder memory's keys and values, projected once.
STATIC_KV = ("static_key", "static_value")


def is_encoder_memory(path) -> bool:
    """A cache leaf (by its pytree path) projected from the encoder output: equal for every beam
    of a sentence, so beam search need not reorder it (decode.beam_search's beam_invariant)."""
    return any(getattr(k, "key", None) in STATIC_KV for k in path)


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
    kv_layout: str = "bkhd",
    product: str = "auto",
) -> tuple[Array, Array]:
    """§3.2.1 softmax(Q K^T / sqrt(d_k)) V over the key axis.

    query [b, q, h, d_k], key [b, k, h, d_k], value [b, k, h, d_v], mask broadcastable to
    [b, h, q, k] (True = attend). Returns (output [b, q, h, d_v], weights [b, h, q, k]).
    kv_layout="bhkd": key/value come heads-first, [b, h, k, d] (the decoding caches' layout, so
    that the whole cache is not transposed at every step). product: matmul.einsum's.
    """
    if kv_layout not in ("bkhd", "bhkd"):
        raise ValueError(f"kv_layout must be 'bkhd' or 'bhkd', got {kv_layout!r}")
    d_k = query.shape[-1]
    # The softmax runs in float32 even for bf16 compute: exp() of bf16 scores loses too much.
    scores = matmul.einsum(
        f"bqhd,{kv_layout}->bhqk", query, key, query.dtype, jnp.float32, product=product
    )
    scores = scores / jnp.sqrt(jnp.float32(d_k))
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
    out = matmul.einsum(
        f"bhqk,{kv_layout}->bqhd", weights, value, value.dtype, product=product
    )  # [b, q, h, d_v]
    return out, weights.astype(value.dtype)


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
    product: str = "auto"  # matmul.einsum's bf16 product (model/matmul.py)

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        mask: Array | None,
        *,
        deterministic: bool = True,
        decode: bool = False,
        static_kv: bool = False,
    ) -> Array:
        """inputs_q [b, q, d_model], inputs_kv [b, k, d_model] -> [b, q, d_model].

        decode=True (self-attention only): inputs_q is one new position [b, 1, d_model]; keys and
        values of earlier positions come from the "cache" collection, which init() sized from a
        full-length input. With static_kv=True (encoder-decoder attention) keys and values
        depend only on the encoder output: they are projected at the first decoding step, kept
        in the cache, and reused at every later step instead of being recomputed.
        """

        def kernel(name: str, features: int) -> Array:
            # [d_model, h, features]. Plain params, not nn.DenseGeneral: its flat-then-reshape
            # init breaks 3-D logical partitioning.
            init = nn.with_logical_partitioning(self.kernel_init, ("embed", "heads", "kv"))
            return self.param(name, init, (inputs_q.shape[-1], self.num_heads, features),
                              self.param_dtype)  # fmt: skip

        def proj(w: Array, x: Array) -> Array:  # [b, l, d_model] -> [b, l, h, features]
            return matmul.einsum("bld,dhf->blhf", x, w, self.dtype, product=self.product)

        w_k, w_v = kernel("key", self.d_k), kernel("value", self.d_v)
        query = proj(kernel("query", self.d_k), inputs_q)  # [b, q, h, d_k]
        query = nn.with_logical_constraint(query, ("batch", "length", "heads", "kv"))
        kv_layout = "bkhd"
        if decode and static_kv:

            def project():  # heads-first [b, h, k, d], the layout the cache keeps
                return tuple(proj(w, inputs_kv).transpose(0, 2, 1, 3) for w in (w_k, w_v))

            key, value = self._static_kv(project)
            kv_layout = "bhkd"
        else:
            key = proj(w_k, inputs_kv)  # [b, k, h, d_k]
            value = proj(w_v, inputs_kv)  # [b, k, h, d_v]
            if decode:
                key, value, mask, kv_layout = self._update_cache(key, value, mask)

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
            kv_layout=kv_layout,
            product=self.product,
        )
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", weights)
        out_init = nn.with_logical_partitioning(self.kernel_init, ("heads", "kv", "embed"))
        w_out = self.param(
            "out", out_init, (self.num_heads, self.d_v, self.d_model), self.param_dtype
        )
        out = matmul.einsum("bqhf,hfd->bqd", out, w_out, self.dtype, product=self.product)
        return out  # [b, q, d_model]

    # Decoding caches keep keys/values heads-first, [b, h, len, d]: attention then reads them
    # as they are, where the [b, len, h, d] layout cost a transpose of the whole cache per
    # layer per step (measured: half of beam-search time).
    def _static_kv(self, project):
        """Keys/values of a fixed memory (the encoder output), projected once per decode.

        They are projected when the cache is created (Transformer.init_cache, with the real
        params and encoder output) and only read afterwards, so the decoding loop neither
        re-projects them nor branches on whether they exist.
        """
        key_name, value_name = STATIC_KV
        if not self.has_variable("cache", key_name):
            key, value = project()
            self.variable("cache", key_name, lambda: key)
            self.variable("cache", value_name, lambda: value)
            return key, value
        return self.get_variable("cache", key_name), self.get_variable("cache", value_name)

    def _update_cache(self, key: Array, value: Array, mask: Array | None):
        """Writes this step's key/value at cache_index and returns the whole cache.

        At init the key/value have the full decode length and only size the cache. Afterwards each
        call brings one position; the returned mask lets it see positions <= cache_index (causal).
        """
        initialized = self.has_variable("cache", "cached_key")
        heads_first = lambda x: x.transpose(0, 2, 1, 3)  # [b, l, h, d] -> [b, h, l, d]
        k_shape, v_shape = heads_first(key).shape, heads_first(value).shape
        cached_key = self.variable("cache", "cached_key", jnp.zeros, k_shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, v_shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return key, value, mask, "bkhd"
        batch, heads, max_len, _ = cached_key.value.shape
        if key.shape[1] != 1:
            raise ValueError(f"decode=True takes one position at a time, got {key.shape[1]}")
        idx = cache_index.value
        zero = jnp.array(0, idx.dtype)
        cached_key.value = jax.lax.dynamic_update_slice(
            cached_key.value, heads_first(key), (zero, zero, idx, zero)
        )
        cached_value.value = jax.lax.dynamic_update_slice(
            cached_value.value, heads_first(value), (zero, zero, idx, zero)
        )
        cache_index.value = idx + 1
        step_mask = (jnp.arange(max_len) <= idx)[None, None, None, :]  # [1, 1, 1, max_len]
        step_mask = jnp.broadcast_to(step_mask, (batch, 1, 1, max_len))
        return cached_key.value, cached_value.value, step_mask, "bhkd"
