"""Resuming a workdir: the new config against the one the run saved, decided before any restore.

A checkpoint holds arrays whose shapes follow `model.*` and the vocabulary, and an optimizer
state whose structure follows `optim.accumulate_steps` and whether gradients are clipped.
Resuming with other values cannot work, and Orbax would only say so with a raw shape error on a
checkpoint it then treats as damaged; so those keys are refused here, by name, with both values.
Keys that only say how long to train, how often to log, evaluate or save, how to decode, or how
the devices are laid out are safe and logged. Anything else (learning rate, data, dropout seed)
restores fine but makes the run a different experiment from an uninterrupted one: a warning.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import ml_collections

from tfm_jax.checkpoint import layout as ckpt_layout
from tfm_jax.checkpoint import reading
from tfm_jax.config import paths
from tfm_jax.config.validate import ConfigError
from tfm_jax.platform import storage

log = logging.getLogger(__name__)

# Changing these changes what the checkpoint's arrays must look like.
REFUSED_PREFIXES = ("model.",)
REFUSED_KEYS = ("data.vocab_size", "data.vocab_path", "optim.accumulate_steps")
# Changing these leaves the run the same experiment.
SAFE_PREFIXES = ("decode.", "mesh.", "paths.", "platform.")
# Dropout generators that draw the same bits (tests/unit/test_prng.py): switching is safe.
SAME_BITS = ("auto", "threefry", "threefry_fused")
# How often a run logs, evaluates or saves, not what it learns (the Table 3 harness continues a
# finished or half-finished run under other values of these).
CADENCE_KEYS = (
    "train.log_every_steps",
    "train.eval_every_steps",
    "train.checkpoint_every_steps",
    "train.checkpoint_every_secs",
    "train.keep_checkpoints",
    "train.keep_checkpoint_period",
)
SAFE_KEYS = (
    "train.num_steps",
    *CADENCE_KEYS,
    "train.average_last",
    "train.profile_steps",
    "train.lease_ttl_secs",
    "train.lease_wait_secs",
    "data.num_workers",
    "data.tfds_data_dir",
    "data.token_cache_dir",
)


class ResumeConfigError(ConfigError):
    """The workdir's checkpoints were written with a config whose shapes differ from this one."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _json_values(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    return _flatten(json.loads(cfg.to_json_best_effort()))


def read_saved_config(workdir: str) -> tuple[dict[str, Any], str] | None:
    """The config of the newest readable checkpoint, else <workdir>/config.json; None if neither.

    Returns (config as nested dict, where it came from).
    """
    try:
        return reading.read_config_json(workdir, "latest"), "the newest checkpoint"
    except Exception as e:  # no checkpoint, or a damaged one: the restore will say which
        log.debug("no config from the checkpoints of %s: %s", workdir, e)
    path = storage.join(workdir, "config.json")
    if ckpt_layout.latest_step_on_disk(workdir) is not None and storage.isfile(path):
        try:
            return json.loads(storage.read_text(path)), path
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", path, e)
    return None


def _grad_clipping(values: dict[str, Any]) -> bool | None:
    norm = values.get("optim.grad_clip_norm")
    return None if norm is None else norm > 0


def compare(saved: dict[str, Any], cfg: ml_collections.ConfigDict) -> tuple[list, list, list]:
    """(refused, safe, other) lists of (key, saved value, new value) for every differing key.

    A key the new config leaves unset (None) while the saved one has it set (the vocabulary a
    run pinned) is not a difference: the run's value is inherited. Keys one side lacks (a config
    from another version of the code) are skipped.
    """
    old, new = _flatten(saved), _json_values(cfg)
    refused, safe, other = [], [], []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        if a == b or (b is None and a is not None and key == "data.vocab_path"):
            continue
        entry = (key, a, b)
        if key == "train.dropout_prng" and a in SAME_BITS and b in SAME_BITS:
            safe.append(entry)
        elif key == "optim.grad_clip_norm":
            (refused if _grad_clipping(old) != _grad_clipping(new) else other).append(entry)
        elif key.startswith(REFUSED_PREFIXES) or key in REFUSED_KEYS:
            refused.append(entry)
        elif key.startswith(SAFE_PREFIXES) or key in SAFE_KEYS:
            safe.append(entry)
        else:
            other.append(entry)
    return refused, safe, other


def _show(entries) -> str:
    return "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in entries)


def _own_vocabulary(pinned: str, saved_workdir: str | None, workdir: str) -> str:
    """The vocabulary file a resumed run pinned, found again if its workdir has moved.

    A missing file is an error, never a new vocabulary: one trained again would not match the
    embedding rows of the checkpoints (and would be written outside this workdir)."""
    found = paths.pinned_file(pinned, saved_workdir, workdir)
    if found is None:
        raise ResumeConfigError(
            f"cannot resume {workdir}: its vocabulary data.vocab_path={pinned!r} does not exist "
            f"(the run was trained in {saved_workdir!r}). Copy that .model file back, or "
            "resume with --config.data.vocab_path=<the run's sentencepiece .model>."
        )
    return found


def check_resume_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """Raises ResumeConfigError if `cfg` cannot resume `workdir`; logs the allowed changes.

    Also makes the run keep its own vocabulary: a new config that does not name one takes the
    vocabulary file the run pinned (so a moved data folder does not train another vocabulary).
    """
    found = read_saved_config(workdir)
    if found is None:
        return
    saved, source = found
    refused, safe, other = compare(saved, cfg)
    if refused:
        fixes = " ".join(f"--config.{k}={a}" for k, a, _ in refused if not isinstance(a, list))
        raise ResumeConfigError(
            f"cannot resume {workdir}: its checkpoints were written with a different "
            f"{'/'.join(sorted({k.split('.')[0] for k, _, _ in refused}))} config "
            f"({_show(refused)}; read from {source}). These keys change the shapes of the saved "
            f"arrays. Resume with the saved values ({fixes}), or train in a new --workdir."
        )
    flat = _flatten(saved)
    pinned = flat.get("data.vocab_path")
    if not cfg.data.vocab_path and pinned:
        cfg.data.vocab_path = _own_vocabulary(pinned, flat.get("paths.workdir"), workdir)
    if safe:
        log.info("Resuming with changed settings: %s", _show(safe))
    if other:
        log.warning(
            "Resuming with changed settings that make this a different experiment from an "
            "uninterrupted run: %s",
            _show(other),
        )
