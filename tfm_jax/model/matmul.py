"""Every matrix product of the model: an einsum in the compute dtype (float32 or bfloat16).

float32 is a plain `jnp.einsum`. bfloat16 is mixed precision: operands are cast to bf16, the
products are accumulated in float32 (`preferred_element_type`), and only the result is rounded.
The gradients are computed the same way, by a custom VJP: the incoming cotangent is cast to bf16
and both operand gradients are bf16 x bf16 -> f32 products. Without it, JAX's transpose of a dot
with an f32 result multiplies the f32 cotangent by the other operand upcast to f32, so the whole
backward pass (2/3 of the FLOPs) runs as f32 matmuls. On CPUs with AVX512-BF16 (and on GPUs and
TPUs) bf16 x bf16 -> f32 is the fast path; a bf16 x bf16 -> bf16 dot is not: XLA:CPU upcasts it
to f32 (measured on a Zen 4 core: 385 GFLOP/s for bf16 -> f32 against 175 for bf16 -> bf16 and
195 for f32). A CPU without AVX512-BF16 has no such units: there bf16 saves memory, not time.

Gradients for float32 operands (the f32 master weights) are returned in float32, accumulated
in float32: the cast to bf16 happens inside the product, so the weight gradient is never
rounded to bf16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tfm_jax import platform
from tfm_jax.platform.products import einsum_terms

Array = jax.Array


def einsum(
    spec: str, a: Array, b: Array, dtype=jnp.float32, out_dtype=None, *, product: str = "auto"
) -> Array:
    """jnp.einsum(spec, a, b) computed in `dtype`, returned in `out_dtype` (default `dtype`).

    spec is a two-operand einsum "ab,bc->ac" in which every index of a term appears in at least
    one other term (no index summed within one operand): the gradients are then einsums too.
    product: how a bf16 product is computed, `platform.PRODUCTS` ("einsum", "cpu_canonical",
    or "auto" for this process's backend); passed down by the module that calls it, so the
    same model object always computes the same way.
    """
    out_dtype = jnp.dtype(out_dtype or dtype)
    if jnp.dtype(dtype) == jnp.float32:
        return jnp.einsum(spec, a, b).astype(out_dtype)
    _check_spec(spec)
    lhs, rhs, _ = einsum_terms(spec)
    if (a.ndim, b.ndim) != (len(lhs), len(rhs)):
        raise ValueError(f"matmul.einsum {spec!r}: operands of rank {a.ndim} and {b.ndim}")
    impl = platform.resolve_product(product)
    return _mixed_einsum(spec, jnp.dtype(dtype), out_dtype, a.dtype, b.dtype, impl, a, b)


@functools.cache
def _check_spec(spec: str) -> None:
    try:
        terms = einsum_terms(spec)
    except ValueError:
        raise ValueError(f"matmul.einsum needs 'lhs,rhs->out', got {spec!r}") from None
    for i, term in enumerate(terms):
        others = "".join(t for j, t in enumerate(terms) if j != i)
        lonely = [c for c in term if c not in others]
        if lonely or len(set(term)) != len(term):
            raise ValueError(
                f"matmul.einsum spec {spec!r}: index {lonely or term} of {term!r} appears in no "
                "other term or twice in one; its gradient would not be an einsum. Reduce that "
                "axis before the product."
            )


def _product(spec: str, a: Array, b: Array, dtype, out_dtype, impl: str) -> Array:
    """One bf16 x bf16 -> f32 product, by the implementation `impl` names (platform seam)."""
    return platform.product_function(impl)(spec, a, b, dtype, out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _mixed_einsum(spec, dtype, out_dtype, a_dtype, b_dtype, impl, a, b):
    return _product(spec, a, b, dtype, out_dtype, impl)


def _mixed_fwd(spec, dtype, out_dtype, a_dtype, b_dtype, impl, a, b):
    # Residuals in the compute dtype: what the product read, and half the memory of f32 weights.
    return _product(spec, a, b, dtype, out_dtype, impl), (a.astype(dtype), b.astype(dtype))


def _mixed_bwd(spec, dtype, out_dtype, a_dtype, b_dtype, impl, residuals, g):
    a, b = residuals
    lhs, rhs, out = einsum_terms(spec)
    g = g.astype(dtype)
    da = _product(f"{out},{rhs}->{lhs}", g, b, dtype, a_dtype, impl)
    db = _product(f"{lhs},{out}->{rhs}", a, g, dtype, b_dtype, impl)
    return da, db


_mixed_einsum.defvjp(_mixed_fwd, _mixed_bwd)
