"""The bf16 x bf16 -> f32 product every backend can run, and the spec parsing both products share.

`plain_product` is one einsum with `preferred_element_type`, as GPU and TPU libraries run it;
cpu.py's `canonical_product` is the CPU one. Which of them a model uses is its `product` field
(platform.resolve_product).
"""

from __future__ import annotations


def einsum_terms(spec: str) -> tuple[str, str, str]:
    """'lhs,rhs->out' of a two-operand einsum spec, as (lhs, rhs, out)."""
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    return lhs, rhs, out


def plain_product(spec: str, a, b, dtype, out_dtype):
    """bf16 operands, f32 sums, any layout: one einsum, as GPU and TPU libraries run it."""
    import jax.numpy as jnp

    out = jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)
    return out.astype(out_dtype)
