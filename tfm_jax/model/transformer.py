"""§3.1 The encoder-decoder stack: layers, stacks and the Transformer with encode()/decode()."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfm_jax.model import attention, matmul
from tfm_jax.model.attention import MultiHeadAttention
from tfm_jax.model.embeddings import PositionalEncoding, SharedEmbedding
from tfm_jax.vocab_ids import BOS_ID, PAD_ID

Array = jax.Array

# model.dtype names -> compute dtypes. The model takes a config that passed
# tfm_jax/config/validate.py (model.dtype, model.norm, model.positional are checked there, once).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class Dense(nn.Module):
    """A d_in -> features affine map, x W + b, in the compute dtype via `matmul.einsum`.

    Same parameters as nn.Dense ("kernel" [d_in, features], "bias" [features]); nn.Dense casts
    the kernel to bf16 before its product, which gives bf16 x bf16 -> bf16 dots and bf16 weight
    gradients (see matmul.py).
    """

    features: int
    axes: tuple[str, str]  # logical axes of the kernel
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    product: str = "auto"  # matmul.einsum's bf16 product (model/matmul.py)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        init = nn.with_logical_partitioning(nn.initializers.xavier_uniform(), self.axes)
        kernel = self.param("kernel", init, (x.shape[-1], self.features), self.param_dtype)
        bias_init = nn.with_logical_partitioning(nn.initializers.zeros, self.axes[1:])
        bias = self.param("bias", bias_init, (self.features,), self.param_dtype)
        out = matmul.einsum("bld,df->blf", x, kernel, self.dtype, product=self.product)
        return out + bias.astype(self.dtype)


class FeedForward(nn.Module):
    """§3.3 FFN(x) = max(0, x W1 + b1) W2 + b2."""

    d_model: int
    d_ff: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    product: str = "auto"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        dense = functools.partial(
            Dense, dtype=self.dtype, param_dtype=self.param_dtype, product=self.product
        )
        h = nn.relu(dense(self.d_ff, ("embed", "mlp"), name="wi")(x))  # [b, l, d_ff]
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        return dense(self.d_model, ("mlp", "embed"), name="wo")(h)  # [b, l, d_model]


class SubLayer(nn.Module):
    """§5.4 residual connection around one sub-layer, with dropout on its output.

    norm="post" is the paper's LayerNorm(x + Dropout(Sublayer(x))); norm="pre" is the later Pre-LN
    variant x + Dropout(Sublayer(LayerNorm(x))) (Xiong et al. 2020), which needs a final LayerNorm
    on each stack (added by the stacks).
    """

    norm: str
    dropout: float
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array, fn, *, deterministic: bool) -> Array:
        ln = nn.LayerNorm(
            epsilon=1e-6,
            dtype=self.dtype,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            name="norm",
        )
        drop = nn.Dropout(rate=self.dropout)
        if self.norm == "post":
            return ln(x + drop(fn(x), deterministic=deterministic))
        return x + drop(fn(ln(x)), deterministic=deterministic)


class _Layer(nn.Module):
    """Fields shared by the encoder and decoder layers (one per model.* size)."""

    d_model: int
    d_ff: int
    num_heads: int
    d_k: int
    d_v: int
    dropout: float
    attention_dropout: float
    norm: str
    dtype: jnp.dtype = jnp.float32
    product: str = "auto"

    def attention(self, name: str) -> MultiHeadAttention:
        return MultiHeadAttention(
            self.num_heads, self.d_k, self.d_v, self.d_model, self.attention_dropout,
            dtype=self.dtype, product=self.product, name=name,
        )  # fmt: skip

    def sublayer(self, name: str) -> SubLayer:
        return SubLayer(self.norm, self.dropout, self.dtype, name=name)

    def ffn(self) -> FeedForward:
        return FeedForward(
            self.d_model, self.d_ff, dtype=self.dtype, product=self.product, name="ffn"
        )


class EncoderLayer(_Layer):
    """§3.1 encoder layer: self-attention, then FFN, each a residual sub-layer."""

    @nn.compact
    def __call__(self, x: Array, mask: Array, *, deterministic: bool) -> Array:
        attn = self.attention("self_attention")
        x = self.sublayer("attention_block")(
            x, lambda y: attn(y, y, mask, deterministic=deterministic), deterministic=deterministic
        )
        x = self.sublayer("ffn_block")(x, self.ffn(), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(_Layer):
    """§3.1 decoder layer: masked self-attention, encoder-decoder attention, FFN."""

    @nn.compact
    def __call__(
        self,
        y: Array,
        encoded: Array,
        self_mask: Array | None,
        cross_mask: Array,
        *,
        deterministic: bool,
        decode: bool,
    ) -> Array:
        self_attn = self.attention("self_attention")
        cross_attn = self.attention("cross_attention")
        y = self.sublayer("self_attention_block")(
            y,
            lambda z: self_attn(z, z, self_mask, deterministic=deterministic, decode=decode),
            deterministic=deterministic,
        )
        y = self.sublayer("cross_attention_block")(
            y,
            lambda z: cross_attn(
                z, encoded, cross_mask, deterministic=deterministic, decode=decode, static_kv=True
            ),
            deterministic=deterministic,
        )
        y = self.sublayer("ffn_block")(y, self.ffn(), deterministic=deterministic)
        return nn.with_logical_constraint(y, ("batch", "length", "embed"))


class _ScannedEncoderLayer(_Layer):
    """One step of `nn.scan` over the encoder layers: (x, broadcast inputs) -> (x, None)."""

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool):
        layer = EncoderLayer(**_layer_fields(self), name="layer")
        return layer(x, mask, deterministic=deterministic), None


class _ScannedDecoderLayer(_Layer):
    """One step of `nn.scan` over the decoder layers (teacher forcing only, no cache)."""

    @nn.compact
    def __call__(self, y, encoded, self_mask, cross_mask, deterministic: bool):
        layer = DecoderLayer(**_layer_fields(self), name="layer")
        y = layer(y, encoded, self_mask, cross_mask, deterministic=deterministic, decode=False)
        return y, None


def _layer_fields(module: _Layer) -> dict:
    names = ("d_model", "d_ff", "num_heads", "d_k", "d_v", "dropout", "attention_dropout", "norm",
             "dtype", "product")  # fmt: skip
    return {f: getattr(module, f) for f in names}


def _scan(layer_cls, num_layers: int, num_broadcast: int):
    """`layer_cls` applied num_layers times as one loop: params stacked on a leading "layers"
    axis, each layer its own init and dropout rngs (nn.scan)."""
    return nn.scan(
        layer_cls,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * num_broadcast,
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )


def unstack_layers(params: dict, num_layers: int) -> dict:
    """Params of a `scan_layers=True` model -> those of the same model unrolled (encoder_0, ...).

    Incremental decoding (and anything else that wants one layer at a time) runs the unrolled
    model on these; the numbers are the same.
    """
    params = dict(params)
    for stack in ("encoder", "decoder"):
        stacked = params.pop(stack)["layer"]
        for i in range(num_layers):
            params[f"{stack}_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return params


def stack_layers(params: dict, num_layers: int) -> dict:
    """The inverse of `unstack_layers`: unrolled params -> those of a `scan_layers=True` model."""
    params = dict(params)
    for stack in ("encoder", "decoder"):
        layers = [params.pop(f"{stack}_{i}") for i in range(num_layers)]
        params[stack] = {"layer": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    return params


def shift_right(targets: Array, positions: Array | None = None) -> Array:
    """Decoder inputs <bos> y1 .. y_{n-1} from targets y1 .. y_n <eos> (labels stay unshifted).

    In packed rows every example starts at position 0, so BOS goes there too. Padding stays PAD so
    that the decoder's key-padding mask can be read off the decoder inputs.
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    if positions is not None:
        shifted = jnp.where(positions == 0, BOS_ID, shifted)
    return jnp.where(targets == PAD_ID, PAD_ID, shifted)


class Transformer(nn.Module):
    """§3 The Transformer: encoder and decoder stacks over one shared embedding.

    Fields map one-to-one onto the `model` section of the config: `Transformer(**cfg.model)`, of
    a config that passed tfm_jax/config/validate.py (the fields are not checked again here).
    """

    vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int = 64
    d_v: int = 64
    dropout: float = 0.1  # §5.4 P_drop: sub-layer outputs and embedding+position sums
    attention_dropout: float = 0.0  # not in the paper (tensor2tensor's switch); 0 = off
    positional: str = "sinusoidal"  # §3.5; "learned" is Table 3 row (E)
    # The learned table's initial std (not in the paper; 0.02 as BERT's): embeddings times
    # sqrt(d_model) start at std 1, so 0.02 starts the positions ~50x smaller than the tokens.
    learned_pos_init_std: float = 0.02
    norm: str = "post"  # §3.1 post-LN; "pre" is the later Pre-LN variant
    max_len: int = 256  # size of the position table: longest source/target sequence
    dtype: str = "float32"  # compute dtype; "bfloat16" keeps float32 master weights
    # One nn.scan over each stack's layers instead of N copies: XLA compiles one layer's body
    # (params stacked on a leading "layers" axis). Teacher forcing only; incremental decoding
    # runs the unrolled model on `unstack_layers(params)`.
    scan_layers: bool = False
    # How a bf16 x bf16 -> f32 product is computed (model/matmul.py): "einsum", "cpu_canonical",
    # or "auto" for this process's backend. Not a `model.*` key: scoring.make_model sets it from
    # platform.product, resolved for the devices the program is compiled for.
    product: str = "auto"

    def setup(self):
        dtype = DTYPES[self.dtype]
        layer_kw = dict(
            d_model=self.d_model, d_ff=self.d_ff, num_heads=self.num_heads, d_k=self.d_k,
            d_v=self.d_v, dropout=self.dropout, attention_dropout=self.attention_dropout,
            norm=self.norm, dtype=dtype, product=self.product,
        )  # fmt: skip
        self.embed = SharedEmbedding(
            self.vocab_size, self.d_model, dtype=dtype, product=self.product
        )
        pos_kw = dict(kind=self.positional, init_std=self.learned_pos_init_std, dtype=dtype)
        self.src_pos = PositionalEncoding(self.d_model, self.max_len, **pos_kw)
        self.tgt_pos = PositionalEncoding(self.d_model, self.max_len, **pos_kw)
        if self.scan_layers:
            self.encoder_stack = _scan(_ScannedEncoderLayer, self.num_layers, 2)(
                **layer_kw, name="encoder"
            )
            self.decoder_stack = _scan(_ScannedDecoderLayer, self.num_layers, 4)(
                **layer_kw, name="decoder"
            )
        else:
            self.encoder_layers = [
                EncoderLayer(**layer_kw, name=f"encoder_{i}") for i in range(self.num_layers)
            ]
            self.decoder_layers = [
                DecoderLayer(**layer_kw, name=f"decoder_{i}") for i in range(self.num_layers)
            ]
        self.embed_dropout = nn.Dropout(self.dropout)
        if self.norm == "pre":
            self.encoder_norm = nn.LayerNorm(epsilon=1e-6, dtype=dtype)
            self.decoder_norm = nn.LayerNorm(epsilon=1e-6, dtype=dtype)

    def encode(
        self,
        inputs: Array,
        inputs_segmentation: Array | None = None,
        inputs_position: Array | None = None,
        *,
        deterministic: bool = True,
    ) -> Array:
        """Source ids [b, s] (PAD=0) -> encoder output [b, s, d_model]."""
        valid = inputs != PAD_ID
        mask = attention.padding_mask(valid, valid)  # [b, 1, s, s]
        if inputs_segmentation is not None:
            mask &= attention.segment_mask(inputs_segmentation, inputs_segmentation)
        x = self.src_pos(self.embed(inputs), inputs_position)
        x = self.embed_dropout(x, deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        if self.scan_layers:
            x, _ = self.encoder_stack(x, mask, deterministic)
        else:
            for layer in self.encoder_layers:
                x = layer(x, mask, deterministic=deterministic)
        if self.norm == "pre":
            x = self.encoder_norm(x)
        return x

    def decode(
        self,
        encoded: Array,
        inputs: Array,
        decoder_inputs: Array,
        *,
        inputs_segmentation: Array | None = None,
        targets_segmentation: Array | None = None,
        targets_position: Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
    ) -> Array:
        """Decoder inputs [b, t] (<bos> y1..; PAD=0) + encoder output -> logits [b, t, vocab].

        decode=True runs one position per call with the key/value cache ("cache" collection,
        created by `init_cache`): decoder_inputs is [b, 1], the next position, counted by the
        cache.
        """
        src_valid = inputs != PAD_ID
        if decode and self.scan_layers:
            raise ValueError(
                "model.scan_layers: incremental decoding runs the unrolled model; build it with "
                "scan_layers=False and params from transformer.unstack_layers(params, num_layers)"
            )
        if decode:
            self_mask = None  # the cache builds the causal mask from its index
            cross_mask = jnp.broadcast_to(
                src_valid[:, None, None, :], (inputs.shape[0], 1, 1, inputs.shape[1])
            )
        else:
            tgt_valid = decoder_inputs != PAD_ID
            self_mask = attention.padding_mask(tgt_valid, tgt_valid)
            self_mask &= attention.causal_mask(decoder_inputs.shape[1])
            cross_mask = attention.padding_mask(tgt_valid, src_valid)
            if targets_segmentation is not None:
                self_mask &= attention.segment_mask(targets_segmentation, targets_segmentation)
                cross_mask &= attention.segment_mask(targets_segmentation, inputs_segmentation)
        y = self.tgt_pos(self.embed(decoder_inputs), targets_position, decode=decode)
        y = self.embed_dropout(y, deterministic=deterministic)
        y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
        if self.scan_layers:
            y, _ = self.decoder_stack(y, encoded, self_mask, cross_mask, deterministic)
        else:
            for layer in self.decoder_layers:
                y = layer(
                    y, encoded, self_mask, cross_mask, deterministic=deterministic, decode=decode
                )
        if self.norm == "pre":
            y = self.decoder_norm(y)
        logits = self.embed.attend(y)  # §3.4 tied pre-softmax projection
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

    def init_cache(self, encoded: Array, inputs: Array, max_decode_len: int) -> None:
        """Creates the decoding cache for outputs of up to max_decode_len tokens.

        Run it as `model.apply({"params": params}, encoded, inputs, max_decode_len,
        method=Transformer.init_cache, mutable=["cache"])[1]["cache"]` with the real params: the
        encoder-decoder attention keys/values are projected from `encoded` here, once, and the
        self-attention caches start empty. Under jit only those projections are computed; the
        decoder pass that sizes the caches feeds nothing and is removed.
        """
        dummy = jnp.full((inputs.shape[0], max_decode_len), BOS_ID, jnp.int32)
        self.decode(encoded, inputs, dummy, decode=True)

    def __call__(
        self,
        inputs: Array,
        targets: Array,
        inputs_segmentation: Array | None = None,
        targets_segmentation: Array | None = None,
        inputs_position: Array | None = None,
        targets_position: Array | None = None,
        *,
        deterministic: bool = True,
    ) -> Array:
        """Teacher forcing: source [b, s], targets y1..y_n <eos> [b, t] -> logits [b, t, vocab]."""
        encoded = self.encode(
            inputs, inputs_segmentation, inputs_position, deterministic=deterministic
        )
        return self.decode(
            encoded,
            inputs,
            shift_right(targets, targets_position),
            inputs_segmentation=inputs_segmentation,
            targets_segmentation=targets_segmentation,
            targets_position=targets_position,
            deterministic=deterministic,
        )
