"""Shared fixtures: a tiny model config that compiles in seconds on one CPU core."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

# Start JAX now, on one CPU device: the inference CLI's --cpu_devices (default one per core) only
# applies before JAX starts, so tests that call it in-process keep this count. Tests that need
# more devices run their own process.
jax.devices()

from tfm_jax.config.build import apply_overrides  # noqa: E402
from tfm_jax.config.defaults import default_config  # noqa: E402
from tfm_jax.config.validate import validate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")


def tiny_config(**overrides):
    """default_config() shrunk to a 2-layer, d_model 32 model over a 64-token vocabulary, validated
    as every config the CLI builds is (the model modules do not check their settings)."""
    cfg = default_config()
    tiny = {
        "model.vocab_size": 64,
        "model.num_layers": 2,
        "model.d_model": 32,
        "model.d_ff": 64,
        "model.num_heads": 4,
        "model.d_k": 8,
        "model.d_v": 8,
        "model.max_len": 64,
        "data.max_len": 64,
        "optim.warmup_steps": 10,
    }
    tiny.update(overrides)
    apply_overrides(cfg, tiny)
    validate(cfg)
    return cfg


@pytest.fixture
def tiny_cfg():
    return tiny_config()
