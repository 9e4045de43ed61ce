"""The presets of the Table 3 sweep: what every (row, seed) run is started with beyond its row.

Each run is `python -m tfm_jax train --config=configs/table3.py:ROW` plus these overrides, as
`--config.*` flags. Every row of a preset gets the same data settings and one shared vocabulary,
so a seed gives every row the same batches in the same order.

  paper  the paper's rows as they are (WMT14 EN-DE through tfds, 100K steps; big 300K).
  small  Multi30k EN-DE on a 2-core CPU with configs/small.py's data settings (read from it,
         not restated): every row scaled by the same factors (widths x 1/4, layers x 1/2),
         1,200 steps by default (big 3x), and a schedule and batch of its own (SMALL_CHANGES).
  gpu    the small preset's runs on one GPU (sweep.py runs them --parallel).
  micro  a seconds-long smoke test of the harness itself (CI).
"""

from __future__ import annotations

import dataclasses
import os

from experiments import REPO
from tfm_jax.config import paths
from tfm_jax.config.build import load_config_file, load_config_module
from tfm_jax.platform import storage

# The rows (and the paper's numbers) live in the config file the runs are started with.
TABLE3_CONFIG = load_config_module(os.path.join(REPO, "configs", "table3.py"))
TABLE3 = TABLE3_CONFIG.ROWS
# Table 3's rows and the explanation experiments' probe rows (configs/table3.py:PROBES).
ALL_ROWS = TABLE3_CONFIG.ALL_ROWS
# The small preset's data and settings: the CPU config's (Multi30k, its vocabulary and lengths,
# packing, bf16 compute, which is 1.26x faster a step on the 2-core CPU at the same dev curve:
# experiments/results/table3_small_budget.md).
SMALL = load_config_file(os.path.join(REPO, "configs", "small.py"))
# What the small preset sets on every row, in the order of the runs' --config.* flags: each key's
# value in configs/small.py unless SMALL_CHANGES has one. Not taken from it: the model's sizes,
# dropout and train.num_steps (the row's, scaled), and decoding's batch and averaging (the
# harness evaluates the latest checkpoint at the default decode.tokens_per_batch).
SMALL_KEYS = (
    "data.source", "data.dir", "data.train_split", "data.eval_split", "data.test_split",
    "model.vocab_size", "model.max_len", "data.max_len", "data.tokens_per_batch", "data.packing",
    "data.packed_length", "model.dtype", "optim.warmup_steps", "optim.lr_factor",
    "train.log_every_steps", "train.eval_every_steps", "train.checkpoint_every_steps",
    "train.checkpoint_every_secs", "train.keep_checkpoints", "decode.max_extra_len",
)  # fmt: skip
# Where the Table 3 sweep departs from configs/small.py (the quickstart's recipe), and why.
SMALL_CHANGES = {
    "data.tokens_per_batch": 8192,  # small.py: 4,096; one batch size for every row and seed
    # 8% of the default 1,200 steps, and kept at any --steps: the schedule then does not depend
    # on the budget. lr_factor 0.5 puts base's peak at 4.4e-3 (the paper's formula at warmup 100
    # would peak at 8.8e-3). Other rows keep the d_model^-0.5 dependence.
    "optim.warmup_steps": 100,
    "optim.lr_factor": 0.5,
    "train.eval_every_steps": 100_000,  # run_overrides: 10 a run, or --eval_every
    # run_overrides: a checkpoint at every evaluation, all kept (the best one is evaluated)
    "train.checkpoint_every_steps": 200,
    "train.keep_checkpoints": 2,
}

# Base's steps in the small preset: where its dev NLL stopped improving by 0.01 nats
# (experiments/results/table3_small_budget.md); big trains 3x, as in the paper.
SMALL_BASE_STEPS = 1200
WIDTH_KEYS = ("model.d_model", "model.d_ff", "model.d_k", "model.d_v")
PRESETS = ("paper", "small", "gpu", "micro")
DEFAULT_SEEDS = {"paper": "0,1", "small": "0,1", "gpu": "0,1,2", "micro": "0"}
# Runs at once (--parallel): a small-preset model uses a sliver of one GPU, and what each run
# costs there is mostly its process start, compilations and beam search, not its steps.
DEFAULT_PARALLEL = {"paper": 1, "small": 1, "gpu": 8, "micro": 1}


@dataclasses.dataclass(frozen=True)
class Variant:
    """The sweep's protocol with one thing changed."""

    overrides: dict  # extra --config.* of every run
    steps: int | None = None  # base's budget (None: the sweep's)
    eval_every: int | None = None  # base's (big: 3x, as its budget); None: the sweep's
    about: str = ""
    # only the budget changes: a run starts from its main run's final checkpoint where that is
    # on disk (runner.continue_main_run), so the first part is not trained twice
    continues: bool = False


VARIANTS: dict[str, Variant] = {
    # The schedule does not depend on train.num_steps, so these runs are the 1,200-step runs
    # continued: the same numbers to step 1,200, evaluated at the same steps (big: 7,200
    # steps, from its 3,600, evaluated every 360 as there).
    "s2400": Variant(
        {},
        steps=2400,
        eval_every=120,
        about="2,400 steps (twice the budget; big 7,200), continued from the main run's last "
        "checkpoint where it is on disk",
        continues=True,
    ),
    "f50": Variant({"data.train_split": "train[:50%]"}, about="the first 50% of the pairs"),
    "f25": Variant({"data.train_split": "train[:25%]"}, about="the first 25% of the pairs"),
}


def row_model(row: str) -> dict:
    """The paper's hyper-parameters of a row (base filled in), as dotted config keys."""
    cfg = TABLE3_CONFIG.row_config(row)
    return {
        "model.num_layers": cfg.model.num_layers,
        "model.d_model": cfg.model.d_model,
        "model.d_ff": cfg.model.d_ff,
        "model.num_heads": cfg.model.num_heads,
        "model.d_k": cfg.model.d_k,
        "model.d_v": cfg.model.d_v,
        "model.dropout": cfg.model.dropout,
        "model.positional": cfg.model.positional,
        "loss.label_smoothing": cfg.loss.label_smoothing,
        "train.num_steps": cfg.train.num_steps,
    }


def step_multiple(row: str) -> int:
    """A row's steps over base's in the paper (big: 3), kept at every budget."""
    return row_model(row)["train.num_steps"] // row_model("base")["train.num_steps"]


def scaled(row: str, width: float, depth: float, base_steps: int) -> dict:
    """One row scaled by the same factors as every other row."""
    paper = row_model(row)
    out = dict(paper)
    for key in WIDTH_KEYS:
        out[key] = max(1, int(round(paper[key] * width)))
    out["model.num_layers"] = max(1, int(round(paper["model.num_layers"] * depth)))
    out["train.num_steps"] = max(1, base_steps * step_multiple(row))
    return out


def preset_overrides(preset: str, row: str, data_dir: str | None, steps: int | None = None) -> dict:
    """The preset's overrides of one row; `steps` (base's budget) replaces the preset's."""
    o = _preset(preset, row, data_dir)
    if steps is not None:
        o["train.num_steps"] = steps * step_multiple(row)
    return o


def _preset(preset: str, row: str, data_dir: str | None) -> dict:
    if preset == "paper":
        return {**row_model(row)}
    if preset in ("small", "gpu"):  # gpu: the small protocol, run --parallel on one GPU
        o = scaled(row, width=0.25, depth=0.5, base_steps=SMALL_BASE_STEPS)
        for key in SMALL_KEYS:
            section, name = key.split(".")
            o[key] = SMALL_CHANGES.get(key, SMALL[section][name])
        o["data.dir"] = data_dir or _from_checkout(SMALL.data.dir)
        return o
    if preset == "micro":
        o = scaled(row, width=1 / 32, depth=1 / 6, base_steps=5)
        o.update({
            "data.source": "folder",
            "data.dir": data_dir,
            "data.train_split": "train",
            "data.eval_split": "val",
            "data.test_split": "val",
            "model.vocab_size": 256,
            "model.max_len": 64,
            "data.max_len": 64,
            "data.tokens_per_batch": 512,
            "data.packing": True,
            "data.packed_length": 64,
            "data.num_buckets": 2,  # evaluation and decoding compile once per bucket shape
            "optim.warmup_steps": 4,
            "train.log_every_steps": 5,
            "train.eval_every_steps": 100_000,
            "train.checkpoint_every_steps": 0,
            "train.checkpoint_every_secs": 0.0,
            "train.keep_checkpoints": 1,
            "decode.max_extra_len": 5,
        })  # fmt: skip
        return o
    raise SystemExit(f"unknown preset {preset!r}: use {', '.join(PRESETS)}")


def _from_checkout(path: str) -> str:
    """A config's path as `python -m tfm_jax` resolves it when run from the checkout's root."""
    return path if paths.is_url(path) else os.path.join(REPO, path)


def run_overrides(
    preset: str,
    row: str,
    seed: int,
    root: str,
    data_dir: str | None = None,
    steps: int | None = None,
    eval_every: int | None = None,
    variant: str | None = None,
) -> dict:
    """Everything one (row, seed) run is started with beyond its row: preset, budget, seed, the
    vocabulary every row and seed share, and a variant's changes (VARIANTS)."""
    v = VARIANTS[variant] if variant else None
    if v is not None:
        steps = v.steps or steps
        eval_every = v.eval_every * step_multiple(row) if v.eval_every else eval_every
    o = preset_overrides(preset, row, data_dir, steps)
    if v is not None:
        o.update(v.overrides)
    # One vocabulary for every row and seed (the first run trains it): the same tokens, so the
    # same batches for a given seed.
    o["data.vocab_path"] = storage.join(root, "vocab", f"spm_{_vocab_size(o)}.model")
    o["train.seed"] = int(seed)
    if eval_every:
        o["train.eval_every_steps"] = int(eval_every)
    elif preset in ("small", "gpu"):  # ten points of each row's dev curve: did it plateau?
        o["train.eval_every_steps"] = max(1, o["train.num_steps"] // 10)
    if preset in ("small", "gpu"):
        # every evaluation a checkpoint, all kept until the run is evaluated (the best one is);
        # and one each 10 minutes between them (only the newest 2 of those kept), so a run cut
        # off by the machine going away loses at most 10 minutes, not an evaluation interval
        # (big's is 360 steps: over an hour on the 2-core CPU)
        every = o["train.eval_every_steps"]
        o["train.checkpoint_every_steps"] = every
        o["train.keep_checkpoint_period"] = every
        o["train.checkpoint_every_secs"] = 600.0
        o["train.keep_checkpoints"] = 2
    return o


def _vocab_size(o: dict) -> int:
    return o.get("model.vocab_size") or TABLE3_CONFIG.get_config("base").model.vocab_size


def cli_args(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]
