"""Benchmarks: matmul peak, train-step throughput/MFU, decoding and the input pipeline.

    python -m experiments.bench [peak|train_step|decode|input ...] [--config=configs/base.py]
        [--config.model.dtype=bfloat16] [--batch=128 --length=32] [--reps=5] [--warmup=1]
        [--variant=NAME:KEY=VAL,KEY=VAL ...] [--devices=8]

Prints one JSON object per line per benchmark ({"bench": "train_step", ...}), each as soon as it
exists, and a timestamped progress line on stderr at every phase (`[+12.3s] base/default:
lowering the train step`), so a run cut short still shows where its time went.
train_step first prints one `{"bench": "train_step_compile", ...}` line per variant (lower_s:
tracing and lowering to HLO; compile_s: XLA's compilation), then times the steps; its train_step
lines repeat those times. Every timing is the median of `--reps` runs after `--warmup` runs, all
in this one process. Progress stamps count from $BENCH_T0 (epoch seconds, which
experiments/gpu_check.sh sets to its own start), else from this process's start. Run from the
checkout's root; one module per benchmark (experiments/bench/__init__.py).

The machine may be shared (CI, other jobs), so absolute numbers drift. Two defences:
  * MFU: the peak matmul is re-timed right before every timed step (interleaved), and MFU is the
    median over reps of (model FLOPs / step time) / (peak at that moment).
  * Variants (`--variant=bf16:model.dtype=bfloat16`, `--variant=noynn:xla_cpu_...=...`) are
    compiled up front and timed round-robin, so their ratios see the same load. Keys that start
    with `xla_` are XLA compiler options (passed to `.compile(compiler_options=...)`), the rest are
    config overrides.

Without --config, train_step runs configs/base.py and configs/small.py (both at --batch x
--length tokens a side, default [128, 32] = 4,096). `--devices=8` simulates 8 CPU devices
(XLA_FLAGS, set before jax is imported) to exercise the sharded step: correctness, not speed;
it also reports the first step's loss on a 1-device mesh, which must match.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import numpy as np

from experiments.bench.peak import Peak, bench_peak
from experiments.bench.progress import emit, median, progress
from experiments.bench.step import StepCase, bench_train_step
from tfm_jax.checkpoint import reading
from tfm_jax.config import paths
from tfm_jax.config.build import build_config, split_overrides

BENCHES = ("peak", "train_step", "decode", "input")
DEFAULT_CONFIGS = ("configs/base.py", "configs/small.py")


def parse_variant(text: str) -> tuple[str, dict[str, str], dict[str, str], dict[str, int]]:
    """'NAME:k=v,k=v' -> (name, config overrides, XLA compiler options, batch shape).

    `batch=` and `length=` give this variant its own synthetic batch (rows, length a side), so
    that shapes can be timed round-robin in one process (e.g. packed rows of 128 against 64 at
    the same tokens a step); the others use --batch and --length.
    """
    name, _, rest = text.partition(":")
    overrides, options, shape = {}, {}, {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--variant {text!r}: {item!r} is not KEY=VALUE")
        if key in ("batch", "length"):
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--variant {text!r}: {key}={value!r} is not a positive integer")
            shape[key] = int(value)
        else:
            (options if key.startswith("xla_") else overrides)[key] = value
    return name or "default", overrides, options, shape


def bench_decode_record(cfg, limit: int | None = None, workdir: str | None = None) -> dict:
    """decode.py's bench_decode(cfg) as a record; a failure is an error record, not a crash."""
    try:
        # lazily: the step benchmarks need nothing of decoding
        from experiments.bench.decode import bench_decode  # noqa: PLC0415

        kw = {"limit": limit} if limit else {}
        return {"bench": "decode", **bench_decode(cfg, workdir=workdir, **kw)}
    except Exception as e:  # noqa: BLE001  (report, keep the other benchmarks going)
        return {"bench": "decode", "error": f"{type(e).__name__}: {e}"}


def bench_input_record(cfg, args) -> dict:
    """The pipeline's batches/s beside the train step's consumption rate on its real batches."""
    from experiments.bench.input_pipeline import bench_input  # noqa: PLC0415
    from tfm_jax import data  # noqa: PLC0415

    record = {"bench": "input", **bench_input(cfg)}
    workdir = os.path.join(tempfile.gettempdir(), "tfm_jax_bench_input")
    tokenizer = data.get_tokenizer(cfg.data, workdir)
    it = data.make_train_iterator(cfg.data, tokenizer, seed=0)
    batch_np = next(iter(it))
    case = StepCase("input", cfg, {k: np.asarray(v) for k, v in batch_np.items()})
    for _ in range(args.warmup):
        case.run()
    case.times = [case.run() for _ in range(args.reps)]
    step_s = median(case.times)
    record["train_batch_shape"] = [list(np.shape(v)) for v in batch_np.values()][:2]
    record["train_step_s"] = step_s
    record["train_batches_per_s"] = 1.0 / step_s
    record["pipeline_over_train"] = record["pipeline_batches_per_s"] * step_s
    record["target_ratio"] = 5.0
    return record


def parse_args(argv: list[str]):
    argv, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("benches", nargs="*", default=["peak", "train_step"], choices=BENCHES)
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        help="config file(s); default: configs/base.py and configs/small.py",
    )
    parser.add_argument("--batch", type=int, default=128, help="rows of the synthetic batch")
    parser.add_argument("--length", type=int, default=32, help="source = target length")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per variant")
    parser.add_argument("--peak_n", type=int, default=None, help="peak matmul size")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:k=v,... (config overrides; xla_* keys are compiler options; batch= and "
        "length= give the variant its own synthetic batch shape)",
    )
    parser.add_argument("--decode_limit", type=int, default=None, help="test sentences")
    parser.add_argument(
        "--workdir",
        default=None,
        help="decode: a trained run (its averaged or latest checkpoint and saved config); "
        "an untrained model never stops early and runs every sentence to its maximum length",
    )
    parser.add_argument("--devices", type=int, default=1, help="simulated CPU devices")
    parser.add_argument(
        "--cpu_devices",
        type=int,
        default=None,
        help="decode alone: CPU devices decoding batches at once, as `python -m tfm_jax "
        "evaluate --cpu_devices` (default: the same, one per core up to 4)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    try:  # before anything is compiled: a bad --variant is a usage error, not a traceback
        args.variants = [parse_variant(text) for text in args.variant or ["default:"]]
    except ValueError as e:
        parser.error(str(e))
    paths.resolve_args(args)
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(list(sys.argv[1:] if argv is None else argv))
    specs = args.config or list(DEFAULT_CONFIGS)
    if args.benches == ["decode"]:  # the evaluate/translate CLI's default; the step benches: 1
        from tfm_jax import platform  # noqa: PLC0415

        platform.split_cpu_devices(args.cpu_devices)
    progress(f"bench {' '.join(args.benches)}: JAX {jax.__version__} on {jax.devices()}")
    peak = Peak(args.peak_n) if {"peak", "train_step"} & set(args.benches) else None
    if "peak" in args.benches:
        emit(bench_peak(peak, args.reps))
    if "train_step" in args.benches:
        cases = []
        for spec in specs:
            label = os.path.splitext(os.path.basename(spec.partition(":")[0]))[0]
            for name, var_overrides, options, shape in args.variants:
                progress(f"{label}/{name}: building the config")
                cfg = build_config(spec, {**overrides, **var_overrides})
                cases.append((f"{label}/{name}", cfg, options, shape))
        for record in bench_train_step(cases, args, peak):
            emit(record)
    if "decode" in args.benches:
        spec = args.config[0] if args.config else (None if args.workdir else specs[0])
        saved = reading.read_config_json(args.workdir) if spec is None else None
        cfg = build_config(spec, dict(overrides), saved)
        progress(f"decode: beam 4 and greedy on {cfg.data.test_split} (each pass twice)")
        emit(bench_decode_record(cfg, args.decode_limit, args.workdir))
    if "input" in args.benches:
        spec = args.config[0] if args.config else "configs/small.py"
        progress("input: pipeline batches/s, then the train step on a real batch")
        emit(bench_input_record(build_config(spec, dict(overrides)), args))
    progress("bench done")
    return 0
