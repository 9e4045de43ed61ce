"""prng.THREEFRY_FUSED draws exactly JAX's threefry bits; dropout through it changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from tfm_jax.config import validate as config_lib
from tfm_jax.train import prng
from tfm_jax.train import trainer as train


def _keys(seed):
    raw = jax.random.PRNGKey(seed)
    return raw, jax.random.wrap_key_data(raw, impl=prng.THREEFRY_FUSED)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5, 11), (16, 9, 32)])
@pytest.mark.parametrize("seed", [0, 123456789])
def test_bits_equal_jax_threefry(shape, seed):
    raw, fused = _keys(seed)
    for dtype in (jnp.uint32, jnp.uint16, jnp.uint8):
        np.testing.assert_array_equal(
            np.asarray(jax.jit(lambda k, dtype=dtype: jax.random.bits(k, shape, dtype))(fused)),
            np.asarray(jax.random.bits(raw, shape, dtype)),
        )


def test_threefry_known_answer():
    # Salmon et al. 2011 / Random123 known-answer vectors for Threefry-2x32 with 20 rounds.
    u32 = lambda x: jnp.uint32(x)  # noqa: E731
    assert [int(x) for x in prng.threefry2x32(u32(0), u32(0), u32(0), u32(0))] == [
        0x6B200159,
        0x99BA4EFE,
    ]
    out = prng.threefry2x32(u32(0x13198A2E), u32(0x03707344), u32(0x243F6A88), u32(0x85A308D3))
    assert [int(x) for x in out] == [0xC4923A9C, 0x483DF7A0]


def test_split_fold_in_and_bernoulli_follow_threefry():
    raw, fused = _keys(7)
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(jax.random.fold_in(fused, 5))),
        np.asarray(jax.random.fold_in(raw, 5)),
    )
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(jax.random.split(fused, 3))),
        np.asarray(jax.random.split(raw, 3)),
    )
    keep = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (64, 33)))
    np.testing.assert_array_equal(np.asarray(keep(fused)), np.asarray(keep(raw)))
    assert abs(float(keep(fused).mean()) - 0.9) < 0.02


def test_config_names_every_generator():
    cfg = tiny_config()
    for name in prng.DROPOUT_PRNGS:
        cfg.train.dropout_prng = name
        config_lib.validate(cfg)
    cfg.train.dropout_prng = "philox"
    with pytest.raises(config_lib.ConfigError, match="train.dropout_prng"):
        config_lib.validate(cfg)


def _first_losses(dropout_prng, steps=2):
    cfg = tiny_config(**{"train.dropout_prng": dropout_prng})
    trainer = train.make_trainer(cfg)
    state = trainer.init_state(0)
    rng = np.random.default_rng(0)
    batch = {k: rng.integers(4, 64, (4, 12)).astype(np.int32) for k in ("inputs", "targets")}
    losses = []
    with trainer.context():
        for _ in range(steps):
            state, metrics = trainer.train_step_fn(state, batch)
            losses.append(float(metrics["loss"]))
    return losses


def test_train_step_with_fused_dropout_equals_threefry():
    fused = _first_losses("threefry_fused")
    np.testing.assert_allclose(fused, _first_losses("threefry"), rtol=1e-6)
    assert not np.allclose(fused, _first_losses("rbg"), rtol=1e-6)  # other masks, other loss
