"""Transformer big on WMT14 EN-DE (Table 3 row "big").

d_model 1024, d_ff 4096, 16 heads, P_drop 0.3, 300K steps, average the last 20 checkpoints: the
row's overrides live once, in configs/table3.py.
"""

import os

from tfm_jax.config.build import load_config_module
from tfm_jax.config.defaults import use_wmt14

TABLE3 = load_config_module(os.path.join(os.path.dirname(__file__), "table3.py"))
PAPER_ROW = TABLE3.ROWS["big"]  # the paper's numbers for this config (the `params` command)


def get_config():
    cfg = use_wmt14(TABLE3.row_config("big"), "de-en")
    cfg.lock()
    return cfg
