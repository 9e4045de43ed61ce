"""Transformer big on WMT14 EN-DE (Table 3 row "big").

d_model 1024, d_ff 4096, 16 heads, P_drop 0.3, 300K steps, average the last 20 checkpoints.
"""

from tfm_jax.config.core import table3_config, use_wmt14


def get_config():
    cfg = use_wmt14(table3_config("big"), "de-en")
    cfg.lock()
    return cfg
