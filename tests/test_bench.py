"""experiments/bench.py runs and prints valid JSON on a micro config (speed targets live in
experiments/results/bench.md, not in assertions)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_DATA

BENCH = os.path.join(REPO, "experiments", "bench.py")
MICRO = [
    "--config=configs/small.py",
    "--config.model.vocab_size=64",
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.model.d_k=16",
    "--config.model.d_v=16",
    "--batch=8",
    "--length=8",
    "--reps=2",
    "--peak_n=128",
]


def run_bench(*args, timeout=120):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, BENCH, *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["bench"], r.get("variant")): r for r in records}


def test_peak_and_train_step_variants():
    out = run_bench(
        "peak", "train_step", *MICRO, "--variant=f32:", "--variant=bf16:model.dtype=bfloat16"
    )
    peak = out[("peak", None)]
    assert peak["f32_flops"] > 0 and peak["bf16_flops"] > 0
    for name, dtype in (("small/f32", "float32"), ("small/bf16", "bfloat16")):
        r = out[("train_step", name)]
        assert r["dtype"] == dtype
        for key in ("tokens_per_s", "step_s", "compile_s", "peak_mem_bytes", "model_flops", "mfu"):
            assert r[key] > 0, key
        assert r["target_tokens"] == 64
        assert r["tokens_per_s"] == pytest.approx(64 / r["step_s"])
        assert r["model_flops"] >= r["matmul_flops_analytic"] * 0.9  # cost analysis sees all dots
        assert len(r["step_s_all"]) == 2
    # bf16 compute starts from the same float32 weights: the first loss agrees loosely
    f32, bf16 = out[("train_step", "small/f32")], out[("train_step", "small/bf16")]
    assert bf16["first_loss"] == pytest.approx(f32["first_loss"], rel=2e-2)


def test_decode_reports_result_or_error():
    out = run_bench("decode", *MICRO, "--config.data.vocab_size=64")
    record = out[("decode", None)]
    assert record["bench"] == "decode"  # a result or {"error": ...}, never a crash


def test_sharded_step_on_8_simulated_devices():
    out = run_bench("train_step", *MICRO, "--devices=8")
    r = out[("train_step", "small/default")]
    assert r["devices"] == 8
    assert r["first_loss_rel_diff"] < 1e-5, r


def test_parse_variant():
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    import bench

    name, overrides, options = bench.parse_variant(
        "x:model.dtype=bfloat16,xla_cpu_enable_fast_math=true"
    )
    assert name == "x"
    assert overrides == {"model.dtype": "bfloat16"}
    assert options == {"xla_cpu_enable_fast_math": "true"}


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")), reason="needs shared Multi30k"
)
def test_input_bench_adds_train_rate():
    out = run_bench("input", *MICRO[:8], "--reps=1", "--config.data.vocab_size=1000",
                    "--config.model.vocab_size=1000", "--config.data.tokens_per_batch=256",
                    timeout=300)  # fmt: skip
    r = out[("input", None)]
    assert r["pipeline_batches_per_s"] > 0 and r["train_batches_per_s"] > 0
    assert r["pipeline_over_train"] == pytest.approx(
        r["pipeline_batches_per_s"] / r["train_batches_per_s"]
    )
