"""Table 3 rows: `--config=configs/table3.py:C256` selects one row (default "base").

Rows are data (tfm_jax.config.core.TABLE3), not copied files. Without a row the `params` command lists
every row.
"""

from tfm_jax.config.core import table3_config, use_wmt14


def get_config(row: str = "base"):
    cfg = use_wmt14(table3_config(row), "de-en")
    cfg.lock()
    return cfg
