"""Tests that start other Python processes: 8 simulated CPU devices against 1, a relaunch
that reads the persistent compilation cache, and the `params` command over every Table 3 row."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, process_env
from helpers.runs import cli_args, tiny_run_overrides, write_tiny_corpus

from tfm_jax.config.build import load_config_module

# 8 simulated CPU devices, in the environment before the helpers package (and JAX) is imported
EIGHT_CPU_DEVICES = process_env(xla_flags="--xla_force_host_platform_device_count=8")
TABLE3 = load_config_module(os.path.join(REPO, "configs", "table3.py"))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_eight_devices_match_one_device():
    out = subprocess.run(
        [sys.executable, "-m", "helpers.sharded_step_check"],
        cwd=os.path.join(REPO, "tests"),  # where `helpers` is a package
        env=EIGHT_CPU_DEVICES,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(results) == {"model1", "model2", "bf16_model2", "scan_model2"}
    for name, r in results.items():  # data-parallel 8x1 and data x model 4x2 (f32 and bf16)
        assert r["cache_size"] == 1, f"{name}: the step compiled {r['cache_size']} times"
        assert r["abstract_params_match"], f"{name}: scoring.abstract_params != the trainer's"
        # a replicated array counted once, not once per device
        assert r["state_bytes_8"] == r["state_bytes_1"] > 0, (name, r)
        if name.startswith("bf16"):  # bf16 rounding of differently ordered f32 sums
            np.testing.assert_allclose(r["loss_8"], r["loss_1"], rtol=1e-2, err_msg=name)
            continue
        np.testing.assert_allclose(r["loss_8"], r["loss_1"], rtol=1e-5, err_msg=name)
        assert r["param_allclose_excess"] <= 0, (name, r)  # params allclose(rtol=1e-5, atol=1e-5)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_relaunch_reads_the_compilation_cache(tmp_path):
    """Two identical tiny `train` runs: the second finds its programs in the persistent cache."""
    corpus = write_tiny_corpus(tmp_path / "corpus")
    cache = str(tmp_path / "xla")
    overrides = tiny_run_overrides(
        corpus, **{"train.num_steps": 4, "platform.compilation_cache": cache}
    )
    # every program, however fast it compiles (the tiny model's take well under the 1 s default)
    env = process_env(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    for run in ("a", "b"):
        argv = ["-m", "tfm_jax", "train", "--config=configs/small.py",
                f"--workdir={tmp_path / run}", *cli_args(overrides)]  # fmt: skip
        p = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        entries = sorted(os.listdir(tmp_path / "xla"))
        if run == "a":
            first = entries
            assert first, "nothing was written to the compilation cache"
    assert entries == first  # the relaunch compiled nothing new: every program was a cache hit


@pytest.mark.multiprocess
def test_params_json_within_7_percent_of_paper_for_every_row():
    out = subprocess.run(
        [sys.executable, "-m", "tfm_jax", "params", "--config=configs/table3.py", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=process_env(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    assert list(rows) == list(TABLE3.ROWS)  # all 20 rows, named as in PAPER.md
    for name, r in rows.items():
        assert r["paper_millions"] == TABLE3.ROWS[name].params_millions
        if r["paper_millions"] is not None:
            ratio = r["params"] / (r["paper_millions"] * 1e6)
            assert 0.93 <= ratio <= 1.07, (name, r)
    # PAPER.md: with exactly 37,000 tokens a faithful model counts 63.1M / 214.2M / 26.8M
    assert rows["base"]["params"] == pytest.approx(63.1e6, rel=0.002)
    assert rows["big"]["params"] == pytest.approx(214.2e6, rel=0.002)
    assert rows["C256"]["params"] == pytest.approx(26.8e6, rel=0.002)
