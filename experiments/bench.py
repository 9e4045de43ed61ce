"""Benchmarks: matmul peak, train-step throughput/MFU, decoding and the input pipeline.

    python experiments/bench.py [peak|train_step|decode|input ...] [--config=configs/base.py]
        [--config.model.dtype=bfloat16] [--batch=128 --length=32] [--reps=5] [--warmup=1]
        [--variant=NAME:KEY=VAL,KEY=VAL ...] [--devices=8]

Prints one JSON object per line per benchmark ({"bench": "train_step", ...}), each as soon as it
exists, and a timestamped progress line on stderr at every phase (`[+12.3s] base/default:
lowering the train step`), so a run cut short still shows where its time went.
train_step first prints one `{"bench": "train_step_compile", ...}` line per variant (lower_s:
tracing and lowering to HLO; compile_s: XLA's compilation), then times the steps; its train_step
lines repeat those times. Every timing is the median of `--reps` runs after `--warmup` runs, all
in this one process. Progress stamps count from $BENCH_T0 (epoch seconds, which
experiments/gpu_check.sh sets to its own start), else from this process's start.

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
import functools
import json
import os
import resource
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Progress stamps count from gpu_check.sh's start where it exports BENCH_T0, else from here; the
# environment carries the stamp across the malloc re-exec below.
os.environ.setdefault("BENCH_T0", repr(time.time()))
T0 = float(os.environ["BENCH_T0"])
BENCHES = ("peak", "train_step", "decode", "input")
MODEL_DIMS = ("num_layers", "d_model", "d_ff", "num_heads", "vocab_size")
DEFAULT_CONFIGS = ("configs/base.py", "configs/small.py")


def _preparse_devices(argv: list[str]) -> None:
    """--devices=N must reach XLA_FLAGS before jax is imported (the CPU client reads it once)."""
    for arg in argv:
        if arg.startswith("--devices="):
            n = int(arg.split("=", 1)[1])
            if n > 1:
                flags = os.environ.get("XLA_FLAGS", "")
                os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}"


sys.path.insert(0, REPO)
if __name__ == "__main__":  # malloc tunables, as `python -m tfm_jax` (tfm_jax/platform/host.py)
    from tfm_jax.platform import host  # noqa: E402

    host.reexec_with_malloc_tunables([os.path.abspath(__file__), *sys.argv[1:]])
_preparse_devices(sys.argv[1:])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tfm_jax.checkpoint import layout  # noqa: E402
from tfm_jax.config import paths  # noqa: E402
from tfm_jax.config.build import build_config, split_overrides  # noqa: E402
from tfm_jax.model import sharding  # noqa: E402
from tfm_jax.model.flops import matmul_flops  # noqa: E402
from tfm_jax.train import trainer as train  # noqa: E402


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def progress(message: str) -> None:
    """One timestamped line on stderr: what this process is about to do, or just did."""
    print(f"[+{time.time() - T0:.1f}s] {message}", file=sys.stderr, flush=True)


def _median(xs):
    return float(statistics.median(xs))


def _since(start: float) -> str:
    return f"{time.perf_counter() - start:.3f} s"


# ---------------------------------------------------------------------------------------------
# peak: the MFU denominator


def default_peak_size() -> int:
    return 8192 if jax.default_backend() == "gpu" else 2048


class Peak:
    """A large square jnp.dot per dtype, compiled once, timable between other measurements."""

    def __init__(self, n: int | None = None):
        self.n = n or default_peak_size()
        self.fns = {}
        progress(f"peak: compiling {self.n}^3 products (f32, bf16) on {jax.devices()[0]}")
        key = jax.random.PRNGKey(0)
        # bf16: bf16 operands, float32 accumulation and result, the product the model's bf16
        # compute uses (tfm_jax/model/matmul.py) and the hardware's bf16 rate; a bf16-result dot is
        # upcast to f32 by XLA:CPU, so it would measure the f32 units.
        dot = functools.partial(jnp.dot, preferred_element_type=jnp.float32)
        for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
            a = jax.random.normal(key, (self.n, self.n), dtype)
            f = jax.jit(dot).lower(a, a).compile()
            jax.block_until_ready(f(a, a))  # warm-up
            self.fns[name] = (f, a)

    def flops_per_s(self, name: str, reps: int = 1) -> float:
        """Best of `reps` timed products (best, not median: it is a ceiling)."""
        f, a = self.fns[name]
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            jax.block_until_ready(f(a, a))
            best = min(best, time.perf_counter() - start)
        return 2.0 * self.n**3 / best


def bench_peak(peak: Peak, reps: int) -> dict:
    progress(f"peak: timing {reps} reps")
    f32 = [peak.flops_per_s("f32") for _ in range(reps)]
    bf16 = [peak.flops_per_s("bf16") for _ in range(reps)]
    return {
        "bench": "peak",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "n": peak.n,
        "f32_flops": _median(f32),
        "bf16_flops": _median(bf16),
        "reps": reps,
    }


# ---------------------------------------------------------------------------------------------
# train_step


def synthetic_batch(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random non-pad ids [batch, length] a side (ids >= 4 skip PAD/BOS/EOS/UNK), no padding."""
    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(4, vocab, size=(batch, length)).astype(np.int32)  # noqa: E731
    return {"inputs": ids(), "targets": ids()}


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


class StepCase:
    """One compiled train step on a fixed batch, ready to be timed."""

    def __init__(self, name, cfg, batch_np, compiler_options=None, mesh=None):
        self.name, self.cfg = name, cfg
        self.rows, self.length = batch_np["targets"].shape  # the synthetic batch's [rows, length]
        shape = "x".join(map(str, batch_np["targets"].shape))
        progress(f"{name}: building the model and optimizer ({cfg.model.dtype}, [{shape}])")
        self.trainer = train.make_trainer(cfg, mesh)
        progress(f"{name}: initializing the train state")
        start = time.perf_counter()
        self.state = jax.block_until_ready(self.trainer.init_state(cfg.train.seed))
        self.init_s = time.perf_counter() - start
        self.batch = sharding.global_batch(batch_np, self.trainer.mesh)
        progress(f"{name}: lowering the train step")
        step = self.trainer.compile_train_step(
            self.state, self.batch, compiler_options, report=lambda m: progress(f"{name}: {m}")
        )
        self.compiled, self.lower_s, self.compile_s = step.executable, step.lower_s, step.compile_s
        progress(f"{name}: compiled in {self.compile_s:.1f} s")
        # the training log's own count (trainer.step_flops: XLA's, else model/flops.py's), so the
        # benchmark's MFU and a run's flops_per_s measure the same FLOPs
        self.flops = step.flops
        mem = self.compiled.memory_analysis()
        # XLA:CPU's peak_memory_in_bytes leaves out the temporaries (activations kept for the
        # backward pass, the logits): the step holds its arguments (donated, so aliased to the
        # outputs), what is not aliased of its outputs, and the temp block all at once.
        self.temp_mem = int(mem.temp_size_in_bytes)
        self.peak_mem = max(
            int(mem.peak_memory_in_bytes),
            int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes)
            + self.temp_mem,
        )
        self.times: list[float] = []
        self.mfus: list[float] = []
        self.sys_s: list[float] = []
        self.user_s: list[float] = []
        self.page_faults: list[int] = []
        self.peaks: list[float] = []
        # Simulated CPU devices share the host's cores, whose peak the Peak matmul already measures.
        self.chips = jax.device_count() if jax.default_backend() != "cpu" else 1
        self.first_loss = None

    def run(self) -> float:
        faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, os.times()
        start = time.perf_counter()
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)
        elapsed = time.perf_counter() - start
        # Kernel time and page faults: on CPU they show when the allocator, not the math, is slow.
        end = os.times()
        self.sys_s.append(end.system - cpu.system)
        self.user_s.append(end.user - cpu.user)
        self.page_faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
        if self.first_loss is None:
            self.first_loss = float(metrics["loss"]) / float(metrics["tokens"])
        return elapsed

    def describe(self, bench: str, batch: int, src_len: int, tgt_len: int) -> dict:
        """The fields every record of this case starts with: what ran where, and its compile."""
        m = self.cfg.model
        return {
            "bench": bench,
            "variant": self.name,
            "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind),
            "dtype": m.dtype,
            "scan_layers": m.scan_layers,
            # flat, so that a line can be read without knowing the config's nesting
            **{k: m[k] for k in MODEL_DIMS},
            "model": {k: m[k] for k in MODEL_DIMS},
            "batch_shape": [batch, src_len, tgt_len],
            "init_s": self.init_s,  # the jitted init, its compilation included
            "lower_s": self.lower_s,
            "compile_s": self.compile_s,  # XLA's compilation alone
            # a persistent cache turns compile_s into a cache read
            "compilation_cache": jax.config.jax_compilation_cache_dir or None,
            # XLA's own settings (gpu_check.sh compares GPU autotune levels by this field)
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        }

    def result(self, batch, src_len, tgt_len, peak_name) -> dict:
        step_s = _median(self.times)
        tokens = batch * tgt_len
        m = self.cfg.model
        return {
            **self.describe("train_step", batch, src_len, tgt_len),
            "target_tokens": tokens,
            "devices": jax.device_count(),
            "tokens_per_s": tokens / step_s,
            "step_s": step_s,
            "step_s_all": [round(t, 4) for t in self.times],
            "peak_mem_bytes": self.peak_mem,
            "temp_mem_bytes": self.temp_mem,
            # medians over every run, warm-up included: CPU seconds in the kernel and in user
            # code (user / step_s ~ cores busy), and minor page faults
            "sys_s": _median(self.sys_s),
            "user_s": _median(self.user_s),
            "page_faults": int(_median(self.page_faults)),
            "model_flops": self.flops,
            "matmul_flops_analytic": matmul_flops(m, batch, src_len, tgt_len),
            "achieved_flops": self.flops / step_s,
            # median achieved / median peak of the samples taken between steps; mfu_paired is the
            # median of per-rep ratios (noisier when steps are much longer than a peak sample)
            "mfu": self.flops / step_s / (_median(self.peaks) * self.chips) if self.peaks else None,
            "mfu_paired": _median(self.mfus) if self.mfus else None,
            "mfu_peak": peak_name,
            "peak_gflops_samples": [round(p / 1e9, 1) for p in self.peaks],
            "first_loss": self.first_loss,
        }


def bench_train_step(cfgs, args, peak: Peak) -> list[dict]:
    """cfgs: [(name, cfg, compiler_options, shape)]; all are timed round-robin with the peak
    between. shape: {"batch", "length"} overriding --batch/--length for that case.

    Each case's compile record is printed as soon as it is compiled, before any step is timed.
    """
    cases = []
    for name, cfg, options, shape in cfgs:
        b, n = shape.get("batch", args.batch), shape.get("length", args.length)
        case = StepCase(name, cfg, synthetic_batch(b, n, cfg.model.vocab_size), options)
        emit(case.describe("train_step_compile", b, n, n))
        cases.append(case)
    for case in cases:
        for i in range(args.warmup):
            start = time.perf_counter()
            case.run()
            progress(f"{case.name}: warm-up step {i + 1}/{args.warmup} {_since(start)}")
    for rep in range(args.reps):
        for case in cases:
            peak_name = "bf16" if case.cfg.model.dtype == "bfloat16" else "f32"
            p = peak.flops_per_s(peak_name, reps=3)
            t = case.run()
            progress(f"{case.name}: timed step {rep + 1}/{args.reps} {t:.3f} s")
            case.times.append(t)
            case.mfus.append(case.flops / t / (p * case.chips))
            case.peaks.append(p)
    out = []
    for case in cases:
        peak_name = "bf16" if case.cfg.model.dtype == "bfloat16" else "f32"
        out.append(case.result(case.rows, case.length, case.length, peak_name))
    if jax.device_count() > 1:  # sharded-step correctness: the same first step on 1 device
        one = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
        for case, record in zip(cases, out, strict=True):
            ref = StepCase(case.name, case.cfg, synthetic_batch(
                case.rows, case.length, case.cfg.model.vocab_size), mesh=one)  # fmt: skip
            ref.run()
            record["first_loss_1device"] = ref.first_loss
            record["first_loss_rel_diff"] = abs(ref.first_loss - case.first_loss) / abs(
                ref.first_loss
            )
    return out


# ---------------------------------------------------------------------------------------------
# decode and input


def bench_decode_record(cfg, limit: int | None = None, workdir: str | None = None) -> dict:
    """experiments/bench_decode.py's bench_decode(cfg), imported lazily (another issue owns it)."""
    try:
        sys.path.insert(0, os.path.join(REPO, "experiments"))
        from bench_decode import bench_decode  # noqa: PLC0415
    except ImportError as e:
        return {"bench": "decode", "error": f"experiments/bench_decode.py not importable: {e}"}
    try:
        kw = {"limit": limit} if limit else {}
        return {"bench": "decode", **bench_decode(cfg, workdir=workdir, **kw)}
    except Exception as e:  # noqa: BLE001  (report, keep the other benchmarks going)
        return {"bench": "decode", "error": f"{type(e).__name__}: {e}"}


def bench_input_record(cfg, args) -> dict:
    """The pipeline's batches/s beside the train step's consumption rate on its real batches."""
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    from bench_input import bench_input  # noqa: PLC0415

    from tfm_jax import data  # noqa: PLC0415

    record = {"bench": "input", **bench_input(cfg)}
    workdir = os.path.join(__import__("tempfile").gettempdir(), "tfm_jax_bench_input")
    tokenizer = data.get_tokenizer(cfg.data, workdir)
    it = data.make_train_iterator(cfg.data, tokenizer, seed=0)
    batch_np = next(iter(it))
    case = StepCase("input", cfg, {k: np.asarray(v) for k, v in batch_np.items()})
    for _ in range(args.warmup):
        case.run()
    case.times = [case.run() for _ in range(args.reps)]
    step_s = _median(case.times)
    record["train_batch_shape"] = [list(np.shape(v)) for v in batch_np.values()][:2]
    record["train_step_s"] = step_s
    record["train_batches_per_s"] = 1.0 / step_s
    record["pipeline_over_train"] = record["pipeline_batches_per_s"] * step_s
    record["target_ratio"] = 5.0
    return record


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str]):
    argv, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
        saved = layout.read_config_json(args.workdir) if spec is None else None
        cfg = build_config(spec, dict(overrides), saved)
        progress(f"decode: beam 4 and greedy on {cfg.data.test_split} (each pass twice)")
        emit(bench_decode_record(cfg, args.decode_limit, args.workdir))
    if "input" in args.benches:
        spec = args.config[0] if args.config else "configs/small.py"
        progress("input: pipeline batches/s, then the train step on a real batch")
        emit(bench_input_record(build_config(spec, dict(overrides)), args))
    progress("bench done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
