"""Config defaults (the paper's base model, §3 and §5) and the Table 3 rows as data.

Every default lives here; experiment files under configs/ override fields of
`default_config()`. Sections map one-to-one onto constructors: `Transformer(**cfg.model)`,
`make_optimizer(**cfg.optim)`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import os

import ml_collections
from ml_collections import config_dict

from tfm_jax.data.config import default_data_config


def default_config() -> ml_collections.ConfigDict:
    """Transformer base (§3, Table 3 row "base") trained as in §5 on WMT14 EN-DE."""
    cfg = ml_collections.ConfigDict()

    cfg.model = ml_collections.ConfigDict()
    cfg.model.vocab_size = 37000  # §5.1 shared BPE vocabulary "of about 37000 tokens"
    cfg.model.num_layers = 6  # N, encoder and decoder each
    cfg.model.d_model = 512
    cfg.model.d_ff = 2048
    cfg.model.num_heads = 8
    cfg.model.d_k = 64  # d_model / h in the paper; set independently for Table 3 row (B)
    cfg.model.d_v = 64
    cfg.model.dropout = 0.1  # §5.4 P_drop
    cfg.model.attention_dropout = 0.0  # not in the paper; tensor2tensor's switch
    cfg.model.positional = "sinusoidal"  # §3.5; "learned" = Table 3 row (E)
    cfg.model.norm = "post"  # §3.1; "pre" is the later Pre-LN variant
    cfg.model.max_len = 256  # position table size; >= data.max_len and decode lengths
    cfg.model.dtype = "float32"  # compute dtype; "bfloat16" keeps float32 master weights
    # nn.scan over each stack's layers (one compiled layer body, params stacked on "layers")
    cfg.model.scan_layers = False

    cfg.optim = ml_collections.ConfigDict()
    cfg.optim.d_model = cfg.model.get_ref(
        "d_model"
    )  # the schedule's d_model^-0.5 follows the model
    cfg.optim.warmup_steps = 4000  # §5.3
    cfg.optim.lr_factor = 1.0  # 1.0 is the paper's formula
    cfg.optim.b1 = 0.9
    cfg.optim.b2 = 0.98
    cfg.optim.eps = 1e-9
    cfg.optim.grad_clip_norm = 0.0  # 0 = off (the paper does not clip)
    cfg.optim.accumulate_steps = 1  # micro-batches per update (reach 25k tokens on few devices)

    cfg.loss = ml_collections.ConfigDict()
    cfg.loss.label_smoothing = 0.1  # §5.4 eps_ls

    cfg.data = default_data_config()
    cfg.data.vocab_size = cfg.model.get_ref("vocab_size")

    cfg.train = ml_collections.ConfigDict()
    cfg.train.num_steps = 100_000  # §5.2 base: 100K steps
    cfg.train.seed = 0
    # Dropout masks: "threefry_fused" draws JAX's default threefry bits, fused (fast on CPU;
    # tfm_jax/train/prng.py); "threefry" is JAX's own lowering of the same bits; "rbg"/"unsafe_rbg"
    # are XLA's RngBitGenerator (other bits). "auto": the platform seam picks between the two
    # threefry ones (tfm_jax/platform), so the numbers are the same on every backend.
    cfg.train.dropout_prng = "auto"
    cfg.train.log_every_steps = 100
    cfg.train.eval_every_steps = 5000
    cfg.train.checkpoint_every_steps = 0  # 0 = only by wall clock
    cfg.train.checkpoint_every_secs = 600.0  # §6.1 "checkpoints written at 10-minute intervals"
    cfg.train.keep_checkpoints = 20  # big models average the last 20 (§6.1)
    cfg.train.average_last = 5  # §6.1 base averages the last 5 checkpoints
    cfg.train.nan_at_step = config_dict.placeholder(int)  # test hook: make the loss NaN there

    cfg.decode = ml_collections.ConfigDict()
    cfg.decode.beam_size = 4  # §6.1
    cfg.decode.alpha = 0.6  # §6.1 GNMT length penalty
    cfg.decode.max_extra_len = 50  # §6.1 output length <= input length + 50
    cfg.decode.tokens_per_batch = 4096  # source tokens per decoding batch
    # Decode first with room for only (padded source length + this) output tokens, then again
    # at the full length only for the sentences that needed more. Exact (the result is the same
    # as one full-length pass) and faster: the KV cache, its per-step beam reorder and the
    # attention over it scale with the buffer. 0 = one full-length pass.
    cfg.decode.first_pass_extra_len = 12

    cfg.mesh = ml_collections.ConfigDict()
    cfg.mesh.data = -1  # devices on the data-parallel axis; -1 = all that `model` leaves
    cfg.mesh.model = 1  # devices on the model-parallel (tensor) axis
    # Logical axis name -> mesh axis. Params and activations name logical axes; these rules place
    # them. With mesh.model > 1, heads, d_ff and the vocabulary are split Megatron-style.
    cfg.mesh.rules = (
        ("batch", "data"),
        ("heads", "model"),
        ("mlp", "model"),
        ("vocab", "model"),
        ("embed", None),
        ("kv", None),
        ("length", None),
        ("layers", None),  # the stacked-layers axis of model.scan_layers
    )

    # Backend-specific choices, resolved by tfm_jax/platform's init_runtime.
    cfg.platform = ml_collections.ConfigDict()
    # bf16 x bf16 -> f32 products: "auto" (CPU: "cpu_canonical", YNNPACK's layout; else
    # "einsum"), or either explicitly.
    cfg.platform.product = "auto"
    # JAX's persistent compilation cache: "auto" (~/.cache/tfm_jax/xla), a folder, or "" (off).
    cfg.platform.compilation_cache = "auto"

    # Filled in by the entry points (tfm_jax/config/paths.py), not by users: local paths in the config
    # are made absolute once, and the run records what was typed and where it was started from.
    cfg.paths = ml_collections.ConfigDict()
    cfg.paths.cwd = config_dict.placeholder(str)  # the directory relative paths were resolved in
    cfg.paths.workdir = config_dict.placeholder(str)  # the run's workdir, absolute
    cfg.paths.typed = ml_collections.ConfigDict()  # as typed, where it differed from the value
    cfg.paths.typed.workdir = config_dict.placeholder(str)
    cfg.paths.typed.data_dir = config_dict.placeholder(str)
    cfg.paths.typed.data_vocab_path = config_dict.placeholder(str)
    cfg.paths.typed.data_tfds_data_dir = config_dict.placeholder(str)
    return cfg


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """One row of Table 3: our overrides of base and the paper's reported numbers."""

    overrides: dict
    ppl: float | None
    bleu: float | None
    params_millions: float | None


# Table 3 of the paper (EN-DE, newstest2013), rows named as in ../shared/PAPER.md. Params are the
# paper's column; blank entries there are None here.
TABLE3: dict[str, PaperRow] = {
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


class ConfigError(ValueError):
    """A config file, row or override the user got wrong; the message says how to fix it."""


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """Sets dotted keys ({"model.d_k": 16}) on a config; unknown keys name the closest valid one."""
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for i, name in enumerate(parents + [leaf]):
            keys = list(node.keys())
            if name not in keys:
                where = ".".join(parents[:i]) or "<top level>"
                close = difflib.get_close_matches(name, keys, n=1)
                hint = f' Did you mean "{".".join(parents[:i] + close)}"?' if close else ""
                raise ConfigError(
                    f'unknown config key "{dotted}": "{name}" is not in {where} '
                    f"(valid: {', '.join(sorted(keys))}).{hint}"
                )
            if i < len(parents):
                node = node[name]
        try:
            node[leaf] = value  # existing keys stay settable on a locked config
        except TypeError as e:
            raise ConfigError(f"config key {dotted}: {e}") from None
    return cfg


def parse_override_value(cfg: ml_collections.ConfigDict, dotted: str, text: str):
    """Command-line text -> a value of the type the config field already has."""
    node = cfg
    *parents, leaf = dotted.split(".")
    try:
        for name in parents:
            node = node[name]
        kind = node.get_type(leaf)
    except (KeyError, AttributeError):
        apply_overrides(cfg.copy_and_resolve_references(), {dotted: None})  # raises, with a hint
        raise
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if kind in (int, float):
            return kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
        if kind in (tuple, list, dict):
            return kind(ast.literal_eval(text))
        return text
    except (ValueError, SyntaxError):
        raise ConfigError(
            f"--config.{dotted}={text!r}: expected a {kind.__name__} like the default"
        ) from None


def table3_config(row: str) -> ml_collections.ConfigDict:
    """The base config with one Table 3 row's overrides applied."""
    if row not in TABLE3:
        close = difflib.get_close_matches(row, list(TABLE3), n=1)
        hint = f' Did you mean "{close[0]}"?' if close else ""
        raise ConfigError(f'unknown Table 3 row "{row}"; rows: {", ".join(TABLE3)}.{hint}')
    cfg = default_config()
    apply_overrides(cfg, TABLE3[row].overrides)
    return cfg


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Loads `path/to/file.py[:arg]` by calling its get_config([arg]), as config_flags does."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist (from --config={spec})")
    module_spec = importlib.util.spec_from_file_location("_tfm_jax_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config() function")
    return module.get_config(arg) if arg else module.get_config()


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

# Every numeric key of default_config() and its allowed values (tests/test_config.py checks that a
# new numeric key cannot be added without a range). Checked once, by `validate`.
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
    "train.average_last": _POSITIVE,
    "train.nan_at_step": Range(lo=1, also=(None,)),
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
    """Early, readable checks of values that would otherwise fail deep inside a jit trace."""
    _check_ranges(cfg)
    m = cfg.model
    if m.positional not in ("sinusoidal", "learned"):
        raise ConfigError(f"model.positional={m.positional!r}: use 'sinusoidal' or 'learned'")
    if m.norm not in ("post", "pre"):
        raise ConfigError(f"model.norm={m.norm!r}: use 'post' (the paper) or 'pre'")
    if m.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"model.dtype={m.dtype!r}: use 'float32' or 'bfloat16'")
    if cfg.train.dropout_prng not in ("auto", "threefry_fused", "threefry", "rbg", "unsafe_rbg"):
        raise ConfigError(
            f"train.dropout_prng={cfg.train.dropout_prng!r}: use 'auto' (default), "
            "'threefry_fused', 'threefry', 'rbg' or 'unsafe_rbg'"
        )
    if "platform" in cfg and cfg.platform.product not in ("auto", "einsum", "cpu_canonical"):
        raise ConfigError(
            f"platform.product={cfg.platform.product!r}: use 'auto' (default), 'einsum' or "
            "'cpu_canonical'"
        )
    if cfg.data.max_len > m.max_len:
        raise ConfigError(
            f"data.max_len={cfg.data.max_len} exceeds model.max_len={m.max_len} (the position "
            "table): raise model.max_len or lower data.max_len"
        )


def use_wmt14(cfg: ml_collections.ConfigDict, pair: str = "de-en") -> ml_collections.ConfigDict:
    """Points the data section at tfds WMT14 (§5.1): "de-en" (37k BPE) or "fr-en" (32k)."""
    if pair not in ("de-en", "fr-en"):
        raise ConfigError(f"WMT14 pair {pair!r}: use 'de-en' or 'fr-en'")
    cfg.data.source = "tfds"
    cfg.data.tfds_name = f"wmt14_translate/{pair}"
    cfg.data.source_lang = "en"  # §5.1: English -> German, English -> French
    cfg.data.target_lang = pair.split("-")[0]
    cfg.data.train_split = "train"
    cfg.data.eval_split = "validation"  # newstest2013
    cfg.data.test_split = "test"  # newstest2014
    cfg.model.vocab_size = 37000 if pair == "de-en" else 32000
    cfg.data.tokens_per_batch = 25000  # §5.1 ~25k source + ~25k target tokens a step
    return cfg


def config_from_json(text: str | dict) -> ml_collections.ConfigDict:
    """A run's saved config (cfg.to_json()) back onto default_config(), keeping field types.

    Going through the defaults (rather than ConfigDict(json.loads(...))) keeps placeholders
    typed and tuples as tuples, so `--config.*` overrides on a saved run behave as on a file.
    """
    import json

    saved = json.loads(text) if isinstance(text, str) else text
    cfg = default_config()

    def assign(node, values, prefix):
        for key, value in values.items():
            dotted = f"{prefix}{key}"
            if key not in node:
                raise ConfigError(f"saved config has key {dotted!r} that this version lacks")
            if isinstance(node[key], ml_collections.ConfigDict):
                assign(node[key], value, dotted + ".")
                continue
            if isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            node[key] = value

    assign(cfg, saved, "")
    return cfg
