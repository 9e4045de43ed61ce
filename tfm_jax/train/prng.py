"""Random bits for dropout: JAX's threefry2x32 stream, computed as one fused elementwise op.

JAX lowers threefry2x32 on CPU as a rolled 5-iteration while loop (to keep compile times
down), so every dropout mask of a step materializes its counters and both hash words in
memory five times over, and the backward pass re-reads both words to rebuild the mask.
`THREEFRY_FUSED` is a JAX PRNG implementation (`jax.extend.random.define_prng_impl`) with the
same key format, the same seed/split/fold_in (JAX's own threefry), and random_bits written
as plain jnp integer ops over an iota of counters: XLA fuses them with the mask compare, so
the mask costs one pass over the output. Its bits are identical to
`jax.random.bits(threefry_key, shape, uint32)` under `jax_threefry_partitionable` (JAX's
default): only the speed differs (tests/unit/test_prng.py checks both).

Measured (base f32 train step, 4,096 target tokens, one process, round-robin): see
experiments/results/bench.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import random as jex_random

_IMPL = "threefry2x32"
# Salmon et al. 2011, Threefry-2x32: rotation constants of the 8 rounds between key injections,
# and the key-schedule parity constant. The same as jax._src.random.threefry2x32.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array):
    """Threefry-2x32 with 20 rounds: key words k0, k1 (uint32 scalars), counters x0, x1."""
    u32 = jnp.uint32
    ks = (k0, k1, k0 ^ k1 ^ u32(_PARITY))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << u32(r)) | (x1 >> u32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + u32(i + 1)
    return x0, x1


def _wrap(key: jax.Array) -> jax.Array:
    return jax.random.wrap_key_data(key, impl=_IMPL)


def _seed(seed: jax.Array) -> jax.Array:
    return jax.random.key_data(jax.random.key(seed, impl=_IMPL))


def _split(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.key_data(jax.random.split(_wrap(key), shape))


def _fold_in(key: jax.Array, data: jax.Array) -> jax.Array:
    return jax.random.key_data(jax.random.fold_in(_wrap(key), data))


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    n = math.prod(shape)
    if bit_width != 32 or n >= 2**32:
        # Other widths (and > 2^32 draws, whose counters need the high word) are rare here:
        # JAX's own implementation, so the stream stays threefry's.
        return jax.random.bits(_wrap(key), shape, np.dtype(f"uint{bit_width}"))
    # Partitionable threefry: draw i hashes the 64-bit counter (0, i) and xors the two words.
    counter = jax.lax.iota(jnp.uint32, n).reshape(shape)
    hi, lo = threefry2x32(key[0], key[1], jnp.zeros_like(counter), counter)
    return hi ^ lo


THREEFRY_FUSED = jex_random.define_prng_impl(
    key_shape=(2,),
    seed=_seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="threefry2x32_fused",
    tag="tff",
)

# train.dropout_prng -> the key implementation the dropout masks are drawn with
DROPOUT_PRNGS = {
    "threefry": _IMPL,
    "threefry_fused": THREEFRY_FUSED,
    "rbg": "rbg",
    "unsafe_rbg": "unsafe_rbg",
}


def dropout_key(key: jax.Array, name: str) -> jax.Array:
    """The key a step's dropout masks are drawn with, from the raw threefry key of the step.

    The train state and checkpoints keep one key format (raw uint32[2] threefry) whatever
    generator `train.dropout_prng=name` picks: "threefry" uses the key as it is,
    "threefry_fused" reads the same key data (so the same bits), and the rbg generators are
    seeded from it.
    """
    if name == "threefry":
        return key
    if name == "threefry_fused":
        return jax.random.wrap_key_data(key, impl=THREEFRY_FUSED)
    seed = jax.random.bits(key, (4,), jnp.uint32)
    return jax.random.wrap_key_data(seed, impl=DROPOUT_PRNGS[name])
