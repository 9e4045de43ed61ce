"""What the tests share: the repository's paths and a tiny model config that compiles in seconds
on one CPU core. Runs on a tiny corpus are in helpers/runs.py."""

import os

from tfm_jax.config.build import apply_overrides
from tfm_jax.config.defaults import default_config
from tfm_jax.config.validate import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
