"""What the tests share: the repository's paths, the environment of the processes they start and
a tiny model config that compiles in seconds on one CPU core. Runs on a tiny corpus are in
helpers/runs.py. Nothing here imports JAX (helpers/sharded_step_check.py sets XLA_FLAGS after
importing this package)."""

import os

from tfm_jax.config.build import apply_overrides
from tfm_jax.config.data import default_data_config
from tfm_jax.config.defaults import default_config
from tfm_jax.config.validate import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")

# XLA flags for every JAX process of the suite, its own (conftest.py) and those it starts
# (process_env): XLA:CPU compiles the tests' tiny programs with LLVM at -O0. The suite compiles
# thousands of tiny programs in hundreds of processes, where LLVM's optimisation costs about half
# of each compile (the tiny train step's: 8 s + 8 s for init and step at the default, 3 s + 5 s at
# -O0) and buys nothing at these sizes. The code under test, the HLO XLA makes of it and its float
# semantics (no fast-math at any level) are the users'; what differs is the machine code, so last
# bits move (that step's loss: 249.000397 by default, 249.000412 at -O0): an equivalence the suite
# checks compares two programs compiled alike, and golden values hold to their tolerances.
# TFM_JAX_TESTS_XLA_FLAGS="" compiles as users do.
TEST_XLA_FLAGS = os.environ.get("TFM_JAX_TESTS_XLA_FLAGS", "--xla_backend_optimization_level=0")


def process_env(*, xla_flags: str = "", **variables: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, on the CPU, unbuffered, with the
    suite's XLA flags and `xla_flags` only (not a developer's: an
    --xla_force_host_platform_device_count of theirs would change what a test runs on), plus
    `variables`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env["XLA_FLAGS"] = f"{TEST_XLA_FLAGS} {xla_flags}".strip()
    env.update(variables)
    return env


def tiny_config(**overrides):
    """default_config() shrunk to a 2-layer, d_model 32 model over a 64-token vocabulary, validated
    as every config the CLI builds is (the model modules do not check their settings)."""
    cfg = default_config()
    tiny = {
        "model.vocab_size": 64,
        "model.num_layers": 2,
        "model.d_model": 32,
        "model.d_ff": 64,
        "model.num_heads": 4,
        "model.d_k": 8,
        "model.d_v": 8,
        "model.max_len": 64,
        "data.max_len": 64,
        "optim.warmup_steps": 10,
    }
    tiny.update(overrides)
    apply_overrides(cfg, tiny)
    validate(cfg)
    return cfg


def data_config(folder, **overrides):
    """The `data` config section over a corpus folder, sized for tests: a 600-piece vocabulary,
    1,024-token batches, sequences up to 64 tokens, one sentencepiece thread."""
    cfg = default_data_config()
    cfg.dir = str(folder)
    cfg.vocab_size = 600
    cfg.tokens_per_batch = 1024
    cfg.max_len = 64
    cfg.packed_length = 128
    cfg.num_workers = 1
    cfg.update(overrides)
    return cfg
