"""Transformer base on WMT14 EN-DE (Table 3 row "base"): the paper's defaults."""

import os

from tfm_jax.config.build import load_config_module
from tfm_jax.config.defaults import use_wmt14

TABLE3 = load_config_module(os.path.join(os.path.dirname(__file__), "table3.py"))
PAPER_ROW = TABLE3.ROWS["base"]  # the paper's numbers for this config (the `params` command)


def get_config():
    cfg = use_wmt14(TABLE3.row_config("base"), "de-en")
    cfg.lock()
    return cfg
