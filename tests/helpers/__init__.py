"""What the tests share: the repository's paths and a tiny model config that compiles in seconds
on one CPU core. Runs on a tiny corpus are in helpers/runs.py."""

import os

from tfm_jax.config.build import apply_overrides
from tfm_jax.config.data import default_data_config
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


def data_config(folder, **overrides):
    """The `data` config section over a corpus folder, sized for tests: a 600-piece vocabulary,
    1,024-token batches, sequences up to 64 tokens, one sentencepiece thread."""
    cfg = default_data_config()
    cfg.dir = str(folder)
    cfg.vocab_size = 600
    cfg.tokens_per_batch = 1024
    cfg.max_len = 64
    cfg.packed_length = 128
    cfg.num_workers = 1
    cfg.update(overrides)
    return cfg
