"""The one place a config is validated: every check of user settings, each message naming the key.

Numeric keys have a `Range` each (RANGES); string keys a fixed set of choices. The model modules
(tfm_jax/model/) take a config that passed `validate` and do not check it again.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from tfm_jax.platform import DROPOUT_PRNGS, PRODUCTS


class ConfigError(ValueError):
    """A config file, row or override the user got wrong; the message says how to fix it."""


# The choices of the model's string settings (tfm_jax/model/transformer.py maps the dtype names).
POSITIONALS = ("sinusoidal", "learned")  # §3.5; "learned" is Table 3 row (E)
NORMS = ("post", "pre")  # §3.1 post-LN; "pre" is the later Pre-LN variant
DTYPES = ("float32", "bfloat16")
# train.dropout_prng and platform.product: the platform seam owns those names
# (DROPOUT_PRNGS, PRODUCTS, imported above).


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric config key allows: lo <= x (or lo < x), x <= hi (or x < hi)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple = ()  # special values allowed outside the range (mesh.data=-1, None for "unset")
    what: str = ""

    def contains(self, x) -> bool:
        if x in self.also:
            return True
        if x is None:
            return False
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return not (self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi))

    def describe(self) -> str:
        lo = None if self.lo is None else ("(" if self.lo_open else "[") + f"{self.lo:g}"
        hi = None if self.hi is None else f"{self.hi:g}" + (")" if self.hi_open else "]")
        if lo and hi:
            text = f"in {lo}, {hi}"
        elif lo:
            text = (">" if self.lo_open else ">=") + f" {self.lo:g}"
        else:
            text = ("<" if self.hi_open else "<=") + f" {self.hi:g}"
        for v in self.also:
            text += f" (or {v})"
        return text


_POSITIVE = Range(lo=1)
_PROBABILITY = Range(lo=0.0, hi=1.0, hi_open=True)

# Every numeric key of default_config() and its allowed values (tests/unit/test_config.py checks
# that a new numeric key cannot be added without a range). Checked once, by `validate`.
RANGES: dict[str, Range] = {
    "model.vocab_size": Range(lo=5, what="4 special ids + at least one piece"),
    "model.num_layers": _POSITIVE,
    "model.d_model": _POSITIVE,
    "model.d_ff": _POSITIVE,
    "model.num_heads": _POSITIVE,
    "model.d_k": _POSITIVE,
    "model.d_v": _POSITIVE,
    "model.dropout": _PROBABILITY,
    "model.attention_dropout": _PROBABILITY,
    "model.learned_pos_init_std": Range(lo=0.0, lo_open=True),
    "model.max_len": Range(lo=2),
    "optim.d_model": _POSITIVE,
    "optim.warmup_steps": _POSITIVE,
    "optim.lr_factor": Range(lo=0.0, lo_open=True),
    "optim.b1": _PROBABILITY,
    "optim.b2": _PROBABILITY,
    "optim.eps": Range(lo=0.0, lo_open=True),
    "optim.grad_clip_norm": Range(lo=0.0, what="0 = no clipping"),
    "optim.accumulate_steps": _POSITIVE,
    "loss.label_smoothing": _PROBABILITY,
    "data.vocab_size": Range(lo=5),
    "data.vocab_sample_sentences": _POSITIVE,
    "data.vocab_character_coverage": Range(lo=0.0, hi=1.0, lo_open=True),
    "data.tokens_per_batch": _POSITIVE,
    "data.max_len": Range(lo=2),
    "data.bpe_dropout": _PROBABILITY,
    "data.num_buckets": _POSITIVE,
    "data.length_multiple": _POSITIVE,
    "data.packed_length": Range(lo=2),
    "data.num_workers": _POSITIVE,
    "train.num_steps": _POSITIVE,
    "train.seed": Range(lo=0, hi=2**32 - 1),
    "train.log_every_steps": _POSITIVE,
    "train.eval_every_steps": _POSITIVE,
    "train.checkpoint_every_steps": Range(lo=0, what="0 = by wall clock only"),
    "train.checkpoint_every_secs": Range(lo=0.0, what="0 = by step count only"),
    "train.keep_checkpoints": _POSITIVE,
    "train.keep_checkpoint_period": Range(lo=0, what="0 = keep only the newest keep_checkpoints"),
    "train.lease_ttl_secs": Range(lo=1.0, what="seconds a dead run's lease blocks the workdir"),
    "train.lease_wait_secs": Range(lo=0.0, what="0 = refuse at once if the workdir is in use"),
    "train.average_last": _POSITIVE,
    "decode.beam_size": _POSITIVE,
    "decode.alpha": Range(lo=0.0, what="0 = no length penalty"),
    "decode.max_extra_len": Range(lo=0),
    "decode.tokens_per_batch": _POSITIVE,
    "decode.first_pass_extra_len": Range(lo=0, what="0 = one full-length pass"),
    "mesh.data": Range(lo=1, also=(-1,), what="-1 = every device mesh.model leaves"),
    "mesh.model": _POSITIVE,
}


def numeric_keys(cfg: ml_collections.ConfigDict, prefix: str = "") -> dict[str, object]:
    """Every int/float leaf (not bools; unset int/float placeholders too) by dotted key."""
    out = {}
    for key in cfg.keys():
        value = cfg[key]
        if isinstance(value, ml_collections.ConfigDict):
            out.update(numeric_keys(value, f"{prefix}{key}."))
        elif cfg.get_type(key) in (int, float):
            out[f"{prefix}{key}"] = value
    return out


def _check_ranges(cfg: ml_collections.ConfigDict) -> None:
    values = numeric_keys(cfg)
    for key, allowed in RANGES.items():
        if key not in values:
            continue  # a config without that section (a test's partial config)
        value = values[key]
        if not allowed.contains(value):
            why = f" ({allowed.what})" if allowed.what else ""
            raise ConfigError(
                f"config key {key}={value!r} is out of range: it must be "
                f"{allowed.describe()}{why}. Set --config.{key}=VALUE (or fix it in the "
                "config file)."
            )


def validate(cfg: ml_collections.ConfigDict) -> None:
    """Early, readable checks of values that would otherwise fail deep inside a jit trace.

    Every path that builds a config calls this (tfm_jax/config/build.py's build_config); the
    modules the config feeds (`Transformer(**cfg.model)`, ...) then assume a valid config.
    """
    _check_ranges(cfg)
    m = cfg.model
    if m.positional not in POSITIONALS:
        raise ConfigError(f"model.positional={m.positional!r}: use 'sinusoidal' or 'learned'")
    if m.norm not in NORMS:
        raise ConfigError(f"model.norm={m.norm!r}: use 'post' (the paper) or 'pre'")
    if m.dtype not in DTYPES:
        raise ConfigError(f"model.dtype={m.dtype!r}: use 'float32' or 'bfloat16'")
    if cfg.train.dropout_prng not in DROPOUT_PRNGS:
        raise ConfigError(
            f"train.dropout_prng={cfg.train.dropout_prng!r}: use 'auto' (default), "
            "'threefry_fused', 'threefry', 'rbg' or 'unsafe_rbg'"
        )
    steps = tuple(cfg.train.get("profile_steps", ()))
    if steps and not (
        len(steps) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in steps)
        and 1 <= steps[0] <= steps[1]
    ):
        raise ConfigError(
            f"train.profile_steps={steps!r}: give two steps A,B with 1 <= A <= B (the trace "
            "holds steps A to B), e.g. --config.train.profile_steps=10,15; () traces nothing"
        )
    if "platform" in cfg and cfg.platform.product not in PRODUCTS:
        raise ConfigError(
            f"platform.product={cfg.platform.product!r}: use 'auto' (default), 'einsum' or "
            "'cpu_canonical'"
        )
    if cfg.data.max_len > m.max_len:
        raise ConfigError(
            f"data.max_len={cfg.data.max_len} exceeds model.max_len={m.max_len} (the position "
            "table): raise model.max_len or lower data.max_len"
        )
