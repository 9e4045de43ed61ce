"""Which glibc malloc tunables a CPU training run should get (tfm_jax/platform/host.py): the same
short Table 3 small-preset run under each setting, one after another in one process tree, with
its training speed and peak resident memory. Prints one JSON line per setting.

    python -m experiments.malloc_ab --rows=base,A32 --steps=60

Settings: none (glibc's defaults), hugetlb (transparent huge pages only: mmapped blocks are
still unmapped on free, so the heap does not keep its high-water mark), all (host.TUNABLES:
one arena that never shrinks, plus huge pages). tok/s is the mean of the logged intervals after
the first (which holds the compilation); peak RSS is the process's high-water mark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from experiments import REPO
from experiments.table3 import presets
from tfm_jax.platform import host

SETTINGS = {
    "none": None,
    "hugetlb": "glibc.malloc.hugetlb=1",
    "all": ":".join(host.TUNABLES),
}


def env_for(setting: str) -> dict:
    """The environment with exactly this setting's tunables (the user's others dropped too)."""
    env = dict(os.environ, TFM_JAX_MALLOC_TUNABLES="0")
    env.pop("GLIBC_TUNABLES", None)
    if SETTINGS[setting]:
        env["GLIBC_TUNABLES"] = SETTINGS[setting]
    return env


def run(row: str, setting: str, steps: int, vocab: str, log_every: int) -> dict:
    o = presets.preset_overrides("small", row, None, steps)
    o.update({
        "train.num_steps": steps,
        "data.vocab_path": vocab,
        "train.log_every_steps": log_every,
        "train.eval_every_steps": 10**6,
        "train.checkpoint_every_steps": 0,
        "train.checkpoint_every_secs": 0.0,
    })  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        config = f"--config=configs/table3.py:{row}"
        cmd = [sys.executable, "-m", "tfm_jax", "train", config, f"--workdir={workdir}"]
        cmd += presets.cli_args(o)
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=REPO, env=env_for(setting), capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            return {
                "row": row,
                "setting": setting,
                "rc": proc.returncode,
                "tail": proc.stderr[-2000:],
            }
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            logged = [m for m in map(json.loads, f) if "target_tokens_per_s" in m]
    later = logged[1:] or logged
    return {
        "row": row,
        "setting": setting,
        "glibc_tunables": SETTINGS[setting],
        "steps": steps,
        "tokens_per_s": sum(m["target_tokens_per_s"] for m in later) / len(later),
        "peak_rss_gb": max(m["peak_rss_bytes"] for m in logged) / 2**30,
        "rss_gb_by_step": {m["step"]: round(m["rss_bytes"] / 2**30, 2) for m in logged},
        "final_loss": logged[-1]["loss"],
        "wall_s": round(wall, 1),
        "host": platform.node(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="base")
    p.add_argument("--settings", default="none,hugetlb,all")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log_every", type=int, default=10)
    # a trained sentencepiece model (the sweep's), so that no run trains one
    p.add_argument("--vocab", default="runs/table3_small_s1200/vocab/spm_8000.model")
    a = p.parse_args()
    vocab = os.path.abspath(a.vocab)
    if not os.path.exists(vocab):
        raise SystemExit(f"--vocab={a.vocab}: no such file; point it at a sweep's spm_8000.model")
    for row in a.rows.split(","):
        for setting in a.settings.split(","):
            if setting not in SETTINGS:
                raise SystemExit(f"--settings: unknown {setting!r}; use {', '.join(SETTINGS)}")
            print(json.dumps(run(row, setting, a.steps, vocab, a.log_every)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
