"""Transformer big on WMT14 EN-FR: as big, but P_drop 0.1 (§6.1) and a 32k vocabulary."""

import os

from tfm_jax.config.build import load_config_module
from tfm_jax.config.defaults import use_wmt14

TABLE3 = load_config_module(os.path.join(os.path.dirname(__file__), "table3.py"))


def get_config():
    cfg = use_wmt14(TABLE3.row_config("big"), "fr-en")
    cfg.model.dropout = 0.1  # §6.1: "the big model trained for EN-FR used P_drop = 0.1"
    cfg.lock()
    return cfg
