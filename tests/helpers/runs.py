"""Tiny parallel-text runs for the training-loop and CLI tests."""

import contextlib
import os
import re
import socket
import subprocess

from helpers import SHARED_DATA, tiny_config

MULTI30K = os.path.join(SHARED_DATA, "multi30k")


def write_tiny_corpus(folder, n_train=1500, n_val=64):
    """The first lines of Multi30k as a small {split}.{lang} folder (made per test, not copied
    into the repo)."""
    os.makedirs(folder, exist_ok=True)
    for split, src_split, n in (("train", "train", n_train), ("val", "val", n_val)):
        for lang in ("en", "de"):
            with open(os.path.join(MULTI30K, f"{src_split}.{lang}"), encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(lines)
    return folder


def tiny_run_overrides(data_dir, **extra):
    """Dotted overrides (as the CLI takes them) for a seconds-long run on the tiny corpus."""
    o = {
        "model.vocab_size": 256,
        "model.num_layers": 1,
        "model.d_model": 32,
        "model.d_ff": 64,
        "model.num_heads": 2,
        "model.d_k": 16,
        "model.d_v": 16,
        "model.max_len": 64,
        # pinned, not configs/small.py's: the tests' numbers were recorded at these
        "model.dropout": 0.1,
        "model.dtype": "float32",
        "data.dir": str(data_dir),
        "data.max_len": 64,
        "data.tokens_per_batch": 512,
        "data.packing": True,
        "data.packed_length": 64,
        # evaluation and decoding batch by length bucket, one compile per bucket shape in every
        # process: 2 buckets, not the default 8 (a tiny train + evaluate: ~30 s -> ~24 s)
        "data.num_buckets": 2,
        "data.test_split": "val",
        "optim.warmup_steps": 20,
        "train.num_steps": 12,
        "train.log_every_steps": 4,
        "train.eval_every_steps": 6,
        "train.checkpoint_every_steps": 4,
        "train.checkpoint_every_secs": 0.0,
        "train.keep_checkpoints": 5,
        "train.average_last": 2,
        "decode.max_extra_len": 10,
    }
    o.update(extra)
    return o


def tiny_run_config(data_dir, **extra):
    return tiny_config(**tiny_run_overrides(data_dir, **extra))


def cli_args(overrides):
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def free_port():
    """A localhost port nothing listens on (a jax.distributed coordinator for 2-process runs)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# What C++ runtimes print on stderr by themselves, before and beside Python's logging: absl's
# "WARNING: All log messages before absl::InitializeLog() ..." and glog-style records
# ("I0000 00:00:1796285602.296721 1043 cudart_stub.cc:31] ...", from the CUDA plugin that CI's
# compile extras install). Not ours to count.
_NATIVE_LOG = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IWEF]\d{4} \d\d:\d\d:\d\d)"
)


def python_lines(stderr: str) -> list[str]:
    """The non-empty lines of a tfm_jax process's stderr that Python wrote (errors, records)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not _NATIVE_LOG.match(ln)]


@contextlib.contextmanager
def killed_on_exit(proc: subprocess.Popen):
    """A process a test drives, killed if the test fails while it runs (not left training)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
