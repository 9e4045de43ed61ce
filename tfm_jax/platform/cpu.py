"""CPU-only code paths (tests: `pytest -m cpu_only`), chosen by the seam in platform/runtime.py.

- `canonical_product`: the bf16 x bf16 -> f32 products of `matmul.einsum` in the one layout
  XLA:CPU runs fast. XLA:CPU runs bf16 x bf16 -> f32 dots only through YNNPACK, which takes
  row-major operands with the contraction last on the left and first on the right; any other
  dot falls back to Eigen, which has no kernel for it ("Unsupported element type for DotThunk").
  So operands are transposed into that form explicitly and optimization barriers keep them
  there. Switch: `platform.product="einsum"` (the accelerators' path; some layouts then fail on
  CPU).
- `split_cpu_devices`: one JAX CPU device per core for decoding. Switch: `--cpu_devices=1`.
- The malloc tunables live in host.py (they act before JAX starts).
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from tfm_jax.platform.products import einsum_terms

Array = jax.Array
log = logging.getLogger(__name__)


def _transpose(x: Array, perm: list[int]) -> Array:
    if perm == sorted(perm):
        return x
    # The barrier keeps XLA from folding the transpose back into the dot's dimension numbers
    # or its layout, which would make the dot non-canonical (see _product).
    return jax.lax.optimization_barrier(jnp.transpose(x, perm))


def _ynn_takes(m: int, k: int, n: int) -> bool:
    """Whether XLA:CPU hands an [m, k] x [k, n] dot to YNNPACK (xla/backends/cpu/ynn_support.cc
    declines matrix-vector products and dots whose sides are all under 8)."""
    return m > 1 and n > 1 and max(m, k, n) >= 8


def canonical_product(spec: str, a: Array, b: Array, dtype, out_dtype) -> Array:
    """The einsum as one canonical [batch, m, k] x [batch, k, n] -> [batch, m, n] matmul.

    XLA:CPU runs bf16 x bf16 -> f32 dots only through YNNPACK, which takes row-major operands
    with the contraction last on the left and first on the right; any other dot falls back to
    Eigen, which has no kernel for it ("Unsupported element type for DotThunk"). So operands are
    transposed into that form explicitly, and kept there.
    """
    lhs, rhs, out = einsum_terms(spec)
    free = [c for c in out if not (c in lhs and c in rhs)]
    if free and free[0] in rhs:  # out is [batch, rhs-free, lhs-free]: swap, no output transpose
        lhs, rhs, a, b = rhs, lhs, b, a
    batch = [c for c in out if c in lhs and c in rhs]
    m = [c for c in out if c in lhs and c not in rhs]
    n = [c for c in out if c in rhs and c not in lhs]
    k = [c for c in lhs if c in rhs and c not in out]
    size = dict(zip(lhs, a.shape, strict=True)) | dict(zip(rhs, b.shape, strict=True))
    prod = lambda cs: int(np.prod([size[c] for c in cs], dtype=np.int64))  # noqa: E731
    a, b = a.astype(dtype), b.astype(dtype)
    if not _ynn_takes(prod(m), prod(k), prod(n)):
        # Same numbers (bf16 operands, f32 sums) through an f32 dot, which Eigen runs.
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    a3 = _transpose(a, [lhs.index(c) for c in batch + m + k])
    b3 = _transpose(b, [rhs.index(c) for c in batch + k + n])
    a3 = a3.reshape(prod(batch), prod(m), prod(k))
    b3 = b3.reshape(prod(batch), prod(k), prod(n))
    c3 = jax.lax.dot_general(
        a3, b3, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32
    )  # [batch, m, n]
    c = c3.astype(out_dtype).reshape([size[ch] for ch in batch + m + n])
    perm = [(batch + m + n).index(ch) for ch in out]
    if perm != sorted(perm):
        c = jnp.transpose(jax.lax.optimization_barrier(c), perm)
    return c


MAX_AUTO_CPU_DEVICES = 4  # each device compiles every batch shape once more


def split_cpu_devices(n: int | None) -> None:
    """Splits a CPU host into n JAX devices, so translate_ids decodes n batches at once.

    XLA:CPU runs one program at a time per device, and a decoding step's many small ops (top-k,
    cache reorder, attention over a few keys) keep about one core busy; with one device per core
    the cores decode different batches instead. Measured on the 2-core machine, quickstart
    model, beam 4: 1.48x the sentences/s of one device, same outputs. None: one device per core,
    at most MAX_AUTO_CPU_DEVICES; 1 leaves JAX's default. Only the CPU platform is affected (a GPU
    or TPU host decodes on its accelerators), JAX_NUM_CPU_DEVICES in the environment wins, and
    it must run before JAX initializes its backends.
    """
    if "JAX_NUM_CPU_DEVICES" in os.environ or "device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if n is None:
        n = min(os.cpu_count() or 1, MAX_AUTO_CPU_DEVICES)
    if n > 1:
        try:
            jax.config.update("jax_num_cpu_devices", n)
        except RuntimeError:  # JAX already running in this process (e.g. called from a test)
            log.info("JAX backends already initialized; keeping %d device(s)", jax.device_count())
