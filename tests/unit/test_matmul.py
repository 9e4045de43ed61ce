"""matmul.einsum: float32 is jnp.einsum; bfloat16 is bf16 operands with float32 sums, both ways."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tfm_jax.model import matmul

# Every product the model makes (attention.py, transformer.py, embeddings.py), with shapes big
# enough for XLA:CPU's YNNPACK path and, last, ones that take the small-dot fallback (a
# one-token decoding step: m = 1; all sides under 8).
CASES = [
    ("bld,df->blf", (2, 9, 16), (16, 24)),
    ("bld,dhf->blhf", (2, 9, 16), (16, 4, 8)),
    ("bqhf,hfd->bqd", (2, 9, 4, 8), (4, 8, 16)),
    ("bqhd,bkhd->bhqk", (2, 9, 4, 8), (2, 11, 4, 8)),
    ("bqhd,bhkd->bhqk", (2, 9, 4, 8), (2, 4, 11, 8)),
    ("bhqk,bkhd->bqhd", (2, 4, 9, 11), (2, 11, 4, 8)),
    ("bhqk,bhkd->bqhd", (2, 4, 9, 11), (2, 4, 11, 8)),
    ("bld,vd->blv", (2, 9, 16), (40, 16)),
    ("bqhd,bhkd->bhqk", (3, 1, 4, 8), (3, 4, 11, 8)),
    ("bld,df->blf", (1, 1, 4), (4, 6)),
]


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("spec,a_shape,b_shape", CASES)
def test_bf16_products_and_gradients_are_f32_sums_of_bf16_operands(spec, a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.normal(size=a_shape).astype(np.float32)
    b = rng.normal(size=b_shape).astype(np.float32)  # an f32 master weight
    inputs, out_term = spec.split("->")
    lhs, rhs = inputs.split(",")
    expected = np.einsum(spec, _bf16(a), _bf16(b))
    out = matmul.einsum(spec, jnp.asarray(a, jnp.bfloat16), b, jnp.bfloat16, jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)

    g = rng.normal(size=expected.shape).astype(np.float32)
    f = lambda a, b: jnp.sum(matmul.einsum(spec, a, b, jnp.bfloat16, jnp.float32) * g)  # noqa: E731
    da, db = jax.jit(jax.grad(f, argnums=(0, 1)))(jnp.asarray(a, jnp.bfloat16), b)
    # a's gradient comes back in a's dtype (bf16); b's in f32, summed in f32 and never rounded.
    assert da.dtype == jnp.bfloat16 and db.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(da, np.float64),
        _bf16(np.einsum(f"{out_term},{rhs}->{lhs}", _bf16(g), _bf16(b))),
        rtol=1e-2,
    )
    np.testing.assert_allclose(
        np.asarray(db), np.einsum(f"{lhs},{out_term}->{rhs}", _bf16(a), _bf16(g)), rtol=1e-5,
        atol=1e-5,
    )  # fmt: skip


def test_float32_is_plain_einsum():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 9, 16)).astype(np.float32), rng.normal(size=(40, 16))
    b = b.astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(matmul.einsum("bld,vd->blv", a, b)), np.asarray(jnp.einsum("bld,vd->blv", a, b))
    )


def test_bf16_result_is_rounded_once():
    a = jnp.full((8, 16), 1.0 + 2**-9, jnp.float32)  # not a bf16 number
    out = matmul.einsum("md,dn->mn", a, jnp.eye(16, 8), jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.ones((8, 8)))  # bf16(a) = 1


@pytest.mark.parametrize("spec", ["ij,jk", "ij,jk->i", "ii,ij->j", "ij,kl->ik"])
def test_bad_specs_raise(spec):
    with pytest.raises(ValueError, match="matmul.einsum"):
        matmul.einsum(spec, jnp.ones((2, 2, 2))[..., 0], jnp.ones((2, 2)), jnp.bfloat16)
