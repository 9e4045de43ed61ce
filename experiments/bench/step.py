"""The train-step benchmark: tokens/s, MFU against the peak timed beside each step, memory, and
the compile's lowering and XLA times, for variants compiled up front and timed round-robin (so
that their ratios see the same load on a shared machine).

The FLOPs are the training log's own count, the model FLOPs of model/flops.py (the analytic matmul
count, PaLM's MFU numerator), so the benchmark's MFU and a run's flops_per_s measure the same
thing on every backend; XLA's count is recorded beside it (xla_flops), a cross-check that
XLA:GPU fails (53% of the base step's matmuls on an H200).
"""

import os
import resource
import time

import jax
import numpy as np

from experiments.bench.peak import Peak
from experiments.bench.progress import emit, median, progress, since
from tfm_jax.model import sharding
from tfm_jax.model.flops import matmul_flops
from tfm_jax.train import trainer as train

MODEL_DIMS = ("num_layers", "d_model", "d_ff", "num_heads", "vocab_size")


def synthetic_batch(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random non-pad ids [batch, length] a side (ids >= 4 skip PAD/BOS/EOS/UNK), no padding."""
    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(4, vocab, size=(batch, length)).astype(np.int32)  # noqa: E731
    return {"inputs": ids(), "targets": ids()}


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
        # the training log's own count (model/flops.py's model FLOPs), and XLA's beside it
        self.flops, self.xla_flops = step.flops, step.xla_flops
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
        step_s = median(self.times)
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
            "sys_s": median(self.sys_s),
            "user_s": median(self.user_s),
            "page_faults": int(median(self.page_faults)),
            "model_flops": self.flops,
            "matmul_flops_analytic": matmul_flops(m, batch, src_len, tgt_len),
            "xla_flops": self.xla_flops or None,  # XLA's count (elementwise too), where it has one
            "achieved_flops": self.flops / step_s,
            # median achieved / median peak of the samples taken between steps; mfu_paired is the
            # median of per-rep ratios (noisier when steps are much longer than a peak sample)
            "mfu": self.flops / step_s / (median(self.peaks) * self.chips) if self.peaks else None,
            "mfu_paired": median(self.mfus) if self.mfus else None,
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
            progress(f"{case.name}: warm-up step {i + 1}/{args.warmup} {since(start)}")
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
