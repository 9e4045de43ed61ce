"""The config defaults: the paper's base model (§3) trained as in §5 (and a saved config on them).

Every default lives here; experiment files under configs/ override fields of
`default_config()`. Sections map one-to-one onto constructors: `Transformer(**cfg.model)`,
`make_optimizer(**cfg.optim)`.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from tfm_jax.config.data import default_data_config
from tfm_jax.config.validate import ConfigError


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
    cfg.model.learned_pos_init_std = 0.02  # "learned" only: the table's initial std
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
    # Also kept, beyond the newest keep_checkpoints: every checkpoint whose step is a multiple
    # of this (0 = none), e.g. each evaluation's, so the best one can be chosen at the end while
    # time-based saves between them are pruned.
    cfg.train.keep_checkpoint_period = 0
    cfg.train.average_last = 5  # §6.1 base averages the last 5 checkpoints
    # One writer per workdir (tfm_jax/platform/lease.py): a run renews <workdir>/train.lease
    # every ttl/4; a lease not renewed for ttl seconds (a lost node) is stale and taken over.
    # A second `train` refuses at once, or waits up to lease_wait_secs for the holder to go.
    cfg.train.lease_ttl_secs = 120.0
    cfg.train.lease_wait_secs = 0.0
    # (A, B): a jax.profiler trace of steps A to B, both included, in <workdir>/profile on
    # process 0 (train/profile.py); () traces nothing. E.g. --config.train.profile_steps=10,15
    cfg.train.profile_steps = ()

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

    # Filled in by the entry points (tfm_jax/config/paths.py), not by users: local paths in the
    # config are made absolute once, and the run records what was typed and where it started from.
    cfg.paths = ml_collections.ConfigDict()
    cfg.paths.cwd = config_dict.placeholder(str)  # the directory relative paths were resolved in
    cfg.paths.workdir = config_dict.placeholder(str)  # the run's workdir, absolute
    cfg.paths.typed = ml_collections.ConfigDict()  # as typed, where it differed from the value
    cfg.paths.typed.workdir = config_dict.placeholder(str)
    cfg.paths.typed.data_dir = config_dict.placeholder(str)
    cfg.paths.typed.data_vocab_path = config_dict.placeholder(str)
    cfg.paths.typed.data_tfds_data_dir = config_dict.placeholder(str)
    cfg.paths.typed.data_token_cache_dir = config_dict.placeholder(str)
    return cfg


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
    # keys older versions saved and this one dropped: ignored, so those runs still load
    retired = {"train.nan_at_step"}  # a removed test hook (always null in real runs)

    def assign(node, values, prefix):
        for key, value in values.items():
            dotted = f"{prefix}{key}"
            if dotted in retired:
                continue
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
