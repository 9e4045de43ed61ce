"""Table 3 rows: `--config=configs/table3.py:C256` selects one row (default "base").

Rows are data (ROWS below: each row's overrides of base and the paper's numbers), not copied
files. Without a row the `params` command lists every row; configs/big.py takes the "big" row from
here, and `python -m experiments.table3` (experiments/table3/) runs the rows.
"""

from __future__ import annotations

import dataclasses
import difflib

from tfm_jax.config.build import apply_overrides
from tfm_jax.config.defaults import default_config, use_wmt14
from tfm_jax.config.validate import ConfigError


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """One row of Table 3: our overrides of base and the paper's reported numbers."""

    overrides: dict
    ppl: float | None
    bleu: float | None
    params_millions: float | None


# Table 3 of the paper (EN-DE, newstest2013), rows named as in ../shared/PAPER.md. Params are the
# paper's column; blank entries there are None here.
ROWS: dict[str, PaperRow] = {
    "base": PaperRow({}, 4.92, 25.8, 65),
    "A1": PaperRow({"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512}, 5.29, 24.9, None),
    "A4": PaperRow({"model.num_heads": 4, "model.d_k": 128, "model.d_v": 128}, 5.00, 25.5, None),
    "A16": PaperRow({"model.num_heads": 16, "model.d_k": 32, "model.d_v": 32}, 4.91, 25.8, None),
    "A32": PaperRow({"model.num_heads": 32, "model.d_k": 16, "model.d_v": 16}, 5.01, 25.4, None),
    "B16": PaperRow({"model.d_k": 16}, 5.16, 25.1, 58),
    "B32": PaperRow({"model.d_k": 32}, 5.01, 25.4, 60),
    "C2": PaperRow({"model.num_layers": 2}, 6.11, 23.7, 36),
    "C4": PaperRow({"model.num_layers": 4}, 5.19, 25.3, 50),
    "C8": PaperRow({"model.num_layers": 8}, 4.88, 25.5, 80),
    "C256": PaperRow({"model.d_model": 256, "model.d_k": 32, "model.d_v": 32}, 5.75, 24.5, 28),
    "C1024": PaperRow({"model.d_model": 1024, "model.d_k": 128, "model.d_v": 128}, 4.66, 26.0, 168),
    "Cff1024": PaperRow({"model.d_ff": 1024}, 5.12, 25.4, 53),
    "Cff4096": PaperRow({"model.d_ff": 4096}, 4.75, 26.2, 90),
    "D0.0": PaperRow({"model.dropout": 0.0}, 5.77, 24.6, None),
    "D0.2": PaperRow({"model.dropout": 0.2}, 4.95, 25.5, None),
    "Dls0.0": PaperRow({"loss.label_smoothing": 0.0}, 4.67, 25.3, None),
    "Dls0.2": PaperRow({"loss.label_smoothing": 0.2}, 5.47, 25.7, None),
    "E": PaperRow({"model.positional": "learned"}, 4.92, 25.7, None),
    "big": PaperRow(
        {
            "model.d_model": 1024,
            "model.d_ff": 4096,
            "model.num_heads": 16,
            "model.dropout": 0.3,
            "train.num_steps": 300_000,
            "train.average_last": 20,
        },
        4.33,
        26.4,
        213,
    ),
}


# Rows that are not in the paper: the probes of the pre-registered explanation experiments
# (experiments/table3/explain.py), at the paper's scale like the rows above (the small preset
# scales them alike). No paper numbers.
PROBES: dict[str, PaperRow] = {
    # heads at base's per-head width d_k = d_v = 64 (A1's and A16's head counts)
    "H1K64": PaperRow({"model.num_heads": 1}, None, None, None),
    "H16K64": PaperRow({"model.num_heads": 16}, None, None, None),
    # per-head width at base's 8 heads (A4's and A16's d_k = d_v)
    "H8K128": PaperRow({"model.d_k": 128, "model.d_v": 128}, None, None, None),
    "H8K32": PaperRow({"model.d_k": 32, "model.d_v": 32}, None, None, None),
    # row E with its learned table started at the token embeddings' scale (std 1, not 0.02)
    "E-std1": PaperRow(
        {"model.positional": "learned", "model.learned_pos_init_std": 1.0}, None, None, None
    ),
}
ALL_ROWS: dict[str, PaperRow] = {**ROWS, **PROBES}


def row_config(row: str):
    """The base config (default_config()) with one row's overrides applied (Table 3's or a
    probe's)."""
    if row not in ALL_ROWS:
        close = difflib.get_close_matches(row, list(ALL_ROWS), n=1)
        hint = f' Did you mean "{close[0]}"?' if close else ""
        raise ConfigError(f'unknown Table 3 row "{row}"; rows: {", ".join(ALL_ROWS)}.{hint}')
    cfg = default_config()
    apply_overrides(cfg, ALL_ROWS[row].overrides)
    return cfg


def get_config(row: str = "base"):
    cfg = use_wmt14(row_config(row), "de-en")
    cfg.lock()
    return cfg
