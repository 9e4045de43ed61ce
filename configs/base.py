"""Transformer base on WMT14 EN-DE (Table 3 row "base"): the paper's defaults."""

from tfm_jax.config.core import default_config, use_wmt14


def get_config():
    cfg = use_wmt14(default_config(), "de-en")
    cfg.lock()
    return cfg
