"""`python -m experiments.bench` runs and prints valid JSON on a micro config, and
experiments/gpu_check.sh runs end to end in its CPU mode (speed targets live in
experiments/results/bench.md, not in assertions)."""

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO, SHARED_DATA, process_env

from experiments.bench import cli as bench

GPU_CHECK = os.path.join(REPO, "experiments", "gpu_check.sh")
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
    env = process_env()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench", *args], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["bench"], r.get("variant")): r for r in records}


@pytest.mark.multiprocess
def test_peak_and_train_step_variants():
    out = run_bench(
        "peak",
        "train_step",
        *MICRO,
        "--variant=f32:model.dtype=float32",
        "--variant=bf16:model.dtype=bfloat16",
        "--variant=rows:model.dtype=bfloat16,batch=16,length=4",
    )
    peak = out[("peak", None)]
    assert peak["f32_flops"] > 0 and peak["bf16_flops"] > 0
    for name, dtype in (("small/f32", "float32"), ("small/bf16", "bfloat16")):
        r = out[("train_step", name)]
        assert r["dtype"] == dtype
        for key in ("tokens_per_s", "step_s", "lower_s", "compile_s", "peak_mem_bytes",
                    "model_flops", "mfu"):  # fmt: skip
            assert r[key] > 0, key
        assert r["backend"] == "cpu" and r["d_model"] == r["model"]["d_model"] == 32
        # the compile record, printed before any step was timed, has the same times
        compiled = out[("train_step_compile", name)]
        assert (compiled["lower_s"], compiled["compile_s"]) == (r["lower_s"], r["compile_s"])
        assert r["target_tokens"] == 64
        assert r["tokens_per_s"] == pytest.approx(64 / r["step_s"])
        # MFU's FLOPs are the analytic count; XLA:CPU's own count sees every dot and a little more
        assert r["model_flops"] == pytest.approx(r["matmul_flops_analytic"])
        assert r["model_flops"] * 0.9 <= r["xla_flops"] <= r["model_flops"] * 1.5
        assert len(r["step_s_all"]) == 2
    # bf16 compute starts from the same float32 weights: the first loss agrees loosely
    f32, bf16 = out[("train_step", "small/f32")], out[("train_step", "small/bf16")]
    assert bf16["first_loss"] == pytest.approx(f32["first_loss"], rel=2e-2)
    # a variant with its own batch shape: twice the rows at half the length, same tokens
    rows = out[("train_step", "small/rows")]
    assert rows["batch_shape"] == [16, 4, 4]
    assert out[("train_step_compile", "small/rows")]["batch_shape"] == [16, 4, 4]
    assert rows["target_tokens"] == 64 and bf16["batch_shape"] == [8, 8, 8]


@pytest.mark.multiprocess
def test_decode_reports_result_or_error():
    out = run_bench("decode", *MICRO, "--config.data.vocab_size=64")
    record = out[("decode", None)]
    assert record["bench"] == "decode"  # a result or {"error": ...}, never a crash


@pytest.mark.multiprocess
def test_sharded_step_on_8_simulated_devices():
    out = run_bench("train_step", *MICRO, "--devices=8")
    r = out[("train_step", "small/default")]
    assert r["devices"] == 8
    assert r["first_loss_rel_diff"] < 1e-5, r


def test_parse_variant():
    name, overrides, options, shape = bench.parse_variant(
        "x:model.dtype=bfloat16,xla_cpu_enable_fast_math=true,batch=64,length=16"
    )
    assert name == "x"
    assert overrides == {"model.dtype": "bfloat16"}
    assert options == {"xla_cpu_enable_fast_math": "true"}
    assert shape == {"batch": 64, "length": 16}
    assert bench.parse_variant("plain:")[3] == {}
    with pytest.raises(ValueError, match="length='0'"):
        bench.parse_variant("bad:length=0")


def test_bad_variant_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["train_step", "--variant=bad:batch=x"])
    assert exit_.value.code == 2
    assert "--variant 'bad:batch=x': batch='x' is not a positive integer" in capsys.readouterr().err


@pytest.mark.multiprocess
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


TRAIN_STEP_FIELDS = ("backend", "d_model", "num_layers", "d_ff", "num_heads", "vocab_size",
                     "lower_s", "compile_s", "step_s", "tokens_per_s", "mfu")  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")), reason="needs shared Multi30k"
)
def test_gpu_check_cpu_mode_end_to_end(tmp_path):
    """The GPU check's every step at tiny shapes: each line it writes parses and has its fields,
    and its progress lines are stamped from one start."""
    results = tmp_path / "gpu_check.jsonl"
    env = process_env(GPU_CHECK_MODE="cpu", GPU_CHECK_OUT=str(results),
                      GPU_CHECK_WORK=str(tmp_path / "work"), PYTHON=sys.executable)  # fmt: skip
    for name in ("BENCH_T0", "GPU_CHECK_BUDGET_S", "GPU_CHECK_DATA"):
        env.pop(name, None)
    proc = subprocess.run(
        ["bash", GPU_CHECK], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = results.read_text().splitlines()
    assert proc.stdout.splitlines() == lines  # each line printed as it was written
    records = [json.loads(line) for line in lines]
    assert [r["bench"] for r in records] == [
        "gpu_check_start", "peak", "train_step_compile", "train_step", "train_step_compile",
        "train_step", "quickstart", "decode", "train_step_compile", "train_step", "gpu_check",
    ]  # fmt: skip

    steps = [r for r in records if r["bench"] == "train_step"]
    assert [r["variant"] for r in steps] == ["base/default", "big/default", "base/default"]
    assert [r["scan_layers"] for r in steps] == [False, False, True]
    for r in steps:
        for key in TRAIN_STEP_FIELDS:
            assert r[key], (r["variant"], key)
        assert r["dtype"] == "bfloat16" and r["target_tokens"] == 16 * 16
    quickstart = next(r for r in records if r["bench"] == "quickstart")
    assert quickstart["ok"] and quickstart["train_steps"] == 12, quickstart
    assert isinstance(quickstart["bleu"], float)
    assert len(quickstart["compile"]) == 1 and quickstart["compile"][0]["compile_s"] > 0
    decode = next(r for r in records if r["bench"] == "decode")
    assert "error" not in decode and decode["beam4_sentences_per_s"] > 0, decode
    assert decode["checkpoint"] == "averaged"
    assert records[-1]["failed"] == 0

    # progress on stderr: the script's steps and the benchmarks' phases, stamped from one start
    stamped = re.findall(r"^\[\+(\d+\.\d)s\] (.*)$", proc.stderr, re.M)
    messages = "\n".join(m for _, m in stamped)
    for text in ("base bf16 train step: up to", "base/default: lowering the train step",
                 "base/default: lowered in", "base/default: compiled in",
                 "base/default: timed step 2/2", "big bf16 train step: done", "quickstart: done",
                 "beam-4 decode: done"):  # fmt: skip
        assert text in messages, text
    times = [float(t) for t, _ in stamped]
    assert times == sorted(times)


@pytest.mark.multiprocess
def test_input_scale_bench_cold_warm_and_two_hosts(tmp_path):
    """input_pipeline.py --scale (issue 16's WMT-scale benchmark) at a tiny scale: a cold start
    builds the token cache, the warm start and two hosts read it; each host gets half the rows."""
    argv = [sys.executable, "-m", "experiments.bench.input_pipeline", "--scale=3000",
            f"--scratch={tmp_path}", "--vocab_size=500", "--tokens_per_batch=2048",
            "--scale_batches=5"]  # fmt: skip
    env = process_env()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["bench"] == "input_scale" and r["pairs"] == 3000
    for key in ("vocab_s", "cold_build_s", "warm_first_batch_s", "batches_per_s", "peak_rss_bytes"):
        assert r[key] > 0, (key, r)
    with open(tmp_path / "tfm_jax_scale_3000" / "train.en", encoding="utf-8") as f:
        assert sum(1 for _ in f) == 3000
    caches = list((tmp_path / "tfm_jax_scale_3000_work" / "vocab" / "tokens").iterdir())
    assert len(caches) == 1, caches  # built once, by the cold start; warm and both hosts read it
    rows = r["global_batch_shapes"][0][0]
    assert [h["local_batch_shapes"][0][0] for h in r["two_hosts"]] == [rows // 2, rows // 2]
    # --warm_only keeps that cache: the same warm batches, no cold start.
    proc = subprocess.run(
        [*argv, "--warm_only"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    w = json.loads(proc.stdout.strip().splitlines()[-1])
    assert w["cold_build_s"] is None and w["global_batch_shapes"] == r["global_batch_shapes"]
    assert list((tmp_path / "tfm_jax_scale_3000_work" / "vocab" / "tokens").iterdir()) == caches
