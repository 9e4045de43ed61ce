"""Transformer big on WMT14 EN-FR: as big, but P_drop 0.1 (§6.1) and a 32k vocabulary."""

from tfm_jax.config.core import table3_config, use_wmt14


def get_config():
    cfg = use_wmt14(table3_config("big"), "fr-en")
    cfg.model.dropout = 0.1  # §6.1: "the big model trained for EN-FR used P_drop = 0.1"
    cfg.lock()
    return cfg
