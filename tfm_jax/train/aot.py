"""Fit before you launch: the programs `train` would run, compiled for a TPU slice or a GPU node
that this host does not have (platform/targets.py), with what each costs a chip.

`compile_for_target` builds the real Trainer over the target's compile-only devices, lowers the
train step for every global batch shape the config can produce and the eval step, compiles each
with XLA for that target, and reads back per-chip memory (arguments, temporaries, peak), FLOPs,
the collectives in the partitioned program and the compile time. A roofline estimate of the step
time follows from FLOPs / peak and bytes / bandwidth.

Batch shapes come from the config (data/plans.config_shapes: without the data's lengths they are
the worst case: evenly spaced buckets up to data.max_len, or the one packed shape), or from
`shapes`, e.g. the "global batch shapes (rows, S, T)" line a `train` run logs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from tfm_jax import platform
from tfm_jax.data import plans
from tfm_jax.model import flops, sharding
from tfm_jax.model.scoring import SEGMENT_KEYS
from tfm_jax.platform.targets import Target
from tfm_jax.train.trainer import make_trainer, xla_flops

log = logging.getLogger(__name__)

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# XLA:TPU's two ways of saying it: "Used 18.00G of 15.75G hbm" and "the total memory required
# for HLO temporaries (60.72G) exceeds available HBM (15.75G)"
_OOM = (
    re.compile(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? (?:hbm|HBM)"),
    re.compile(
        r"required for [^(]*\(([\d.]+)([KMGT]?)i?B?\) exceeds available HBM \(([\d.]+)([KMGT]?)"
    ),
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass
class Program:
    """One compiled program and what it costs one chip."""

    name: str  # "train_step" | "eval_step"
    shape: tuple[int, int, int]  # global (rows, S, T)
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0  # outputs written into donated arguments
    temp_bytes: int = 0
    peak_bytes: int = 0  # arguments + outputs not aliased + temporaries, all live at once
    flops_per_chip: float = 0.0
    # "xla" (cost analysis) | "analytic" (model/flops.py: XLA gives none, or counts a scanned
    # layer once)
    flops_source: str = "xla"
    model_flops_per_chip: float = 0.0  # analytic matmul FLOPs: MFU's numerator
    bytes_accessed_per_chip: float | None = None  # XLA's count where it gives one (TPU)
    bytes_source: str = "xla"  # or "memory analysis (lower bound)": args + outputs + 2 x temps
    collectives: dict[str, int] = dataclasses.field(default_factory=dict)
    lower_s: float = 0.0
    compile_s: float = 0.0
    fits: bool = True
    error: str | None = None  # why it does not fit / did not compile, one line
    step_s_estimate: float = 0.0
    mfu_estimate: float = 0.0


def abstract_batch(shape: tuple[int, int, int], mesh: Mesh, packed: bool) -> dict:
    """ShapeDtypeStructs of a global batch, sharded as the loop places it."""
    rows, src_len, tgt_len = shape
    spec = sharding.batch_sharding(mesh)
    side = {"inputs": src_len, "targets": tgt_len}
    keys = ["inputs", "targets"] + (list(SEGMENT_KEYS) if packed else [])
    return {
        k: jax.ShapeDtypeStruct((rows, side[k.split("_")[0]]), jnp.int32, sharding=spec)
        for k in keys
    }


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective ops in a compiled (partitioned) HLO module's text; async pairs count once."""
    counts = {}
    for op in COLLECTIVES:
        n = len(re.findall(rf"\s{op}(?:-start)?\(", hlo_text))
        if n:
            counts[op] = n
    return counts


def _oom_line(program: Program, message: str, target: Target) -> str:
    got = _OOM[0].search(message) or _OOM[1].search(message)
    budget = target.memory_budget() / 2**30
    where = f"{program.name} {list(program.shape)} (rows, S, T)"
    if got:
        used = float(got.group(1)) * _UNITS[got.group(2)] / 2**30
        cap = float(got.group(3)) * _UNITS[got.group(4)] / 2**30
        program.peak_bytes = int(used * 2**30)  # at least: what XLA said it needs
        return (
            f"{where} needs {used:.2f} GiB a chip of {target.name}'s {cap:.2f} GiB "
            f"({used - cap:.2f} GiB over)"
        )
    return f"{where} ran out of memory on {target.name} ({budget:.2f} GiB a chip)"


def _measure(program: Program, lowered, compiled, target: Target, cfg, analytic: float) -> None:
    dtype, scanned = cfg.model.dtype, bool(cfg.model.scan_layers)
    mem = compiled.memory_analysis()
    program.argument_bytes = int(mem.argument_size_in_bytes)
    program.output_bytes = int(mem.output_size_in_bytes)
    program.alias_bytes = int(mem.alias_size_in_bytes)
    program.temp_bytes = int(mem.temp_size_in_bytes)
    program.peak_bytes = (
        program.argument_bytes + program.output_bytes - program.alias_bytes + program.temp_bytes
    )
    devices = target.num_devices
    # XLA counts a scanned layer once (trainer.step_flops): the analytic count there
    counted = 0.0 if scanned else xla_flops(lowered, compiled, devices)
    program.flops_source = "xla" if counted else "analytic"
    program.flops_per_chip = (counted or analytic) / devices
    program.model_flops_per_chip = analytic / devices
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
        accessed = float((cost or {}).get("bytes accessed", 0.0))
        program.bytes_accessed_per_chip = accessed or None
    except Exception:  # noqa: BLE001  (no cost analysis on this backend)
        program.bytes_accessed_per_chip = None
    program.collectives = count_collectives(compiled.as_text() or "")
    program.fits = program.peak_bytes <= target.memory_budget()
    if not program.fits:
        over = (program.peak_bytes - target.memory_budget()) / 2**30
        program.error = (
            f"{program.name} {list(program.shape)} (rows, S, T) needs "
            f"{program.peak_bytes / 2**30:.2f} GiB a chip of {target.name}'s "
            f"{target.memory_budget() / 2**30:.2f} GiB ({over:.2f} GiB over)"
        )
    peak = target.peak_flops(dtype)
    compute_s = program.flops_per_chip / peak
    accessed = program.bytes_accessed_per_chip  # with scan_layers, a layer's bytes count once
    if accessed is None:  # no cost analysis (XLA:GPU): each argument, output and temp byte moves
        program.bytes_source = "memory analysis (lower bound)"  # at least once, temps twice
        accessed = program.argument_bytes + program.output_bytes + 2 * program.temp_bytes
    memory_s = accessed / target.chip.hbm_bandwidth
    program.step_s_estimate = max(compute_s, memory_s)
    if program.step_s_estimate > 0:
        program.mfu_estimate = program.model_flops_per_chip / (program.step_s_estimate * peak)


def compile_for_target(
    cfg: ml_collections.ConfigDict,
    target: Target,
    shapes: Sequence[tuple[int, int, int]] | None = None,
    report: Callable[[str], None] = lambda message: None,
    eval_step: bool = True,
) -> dict:
    """Compiles every train-step shape and the eval step for `target`; one record of the costs.

    cfg: the run's config (as `train` would build it). shapes: global (rows, S, T) of the train
    batches; default: data/plans.config_shapes. The eval step is compiled at each of the
    bucketed shapes (evaluation never packs), unless eval_step=False. report: told as each
    program starts and ends.
    """
    platform.init_runtime(cfg, target=target.platform)
    devices = target.devices()
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.model, devices)
    trainer = make_trainer(cfg, mesh)
    unit = sharding.data_parallel_size(mesh)  # the loop's batch_multiple x process_count
    packed = bool(cfg.data.packing)
    source = "given" if shapes else "config (worst case: no data read)"
    train_shapes = [tuple(s) for s in shapes] if shapes else plans.config_shapes(cfg.data, unit)
    eval_shapes = (
        train_shapes if shapes and not packed else plans.config_shapes(cfg.data, unit, False)
    )
    jobs = [("train_step", s, packed) for s in train_shapes]
    jobs += [("eval_step", s, False) for s in eval_shapes] if eval_step else []
    programs: list[Program] = []
    for i, (name, shape, pack) in enumerate(jobs):
        program = Program(name, tuple(int(x) for x in shape))
        report(f"[{i + 1}/{len(jobs)}] {name} {list(shape)}: lowering")
        batch = abstract_batch(program.shape, mesh, pack)
        rows, src_len, tgt_len = program.shape
        if name == "train_step":
            fn, args = trainer.train_step_fn, (trainer.abstract_state, batch)
            analytic = flops.matmul_flops(cfg.model, rows, src_len, tgt_len)
        else:
            fn, args = trainer.eval_step_fn, (trainer.abstract_state.params, batch)
            analytic = flops.forward_flops(cfg.model, rows, src_len, tgt_len)
        with trainer.context():
            start = time.perf_counter()
            lowered = fn.lower(*args)
            program.lower_s = time.perf_counter() - start
            start = time.perf_counter()
            try:
                compiled = lowered.compile()
            except Exception as e:  # noqa: BLE001  (XLA's errors: OOM is an answer, not a bug)
                program.compile_s = time.perf_counter() - start
                text = str(e)
                if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
                    raise
                program.fits, program.error = False, _oom_line(program, text, target)
                programs.append(program)
                report(f"[{i + 1}/{len(jobs)}] {name}: does not fit ({program.compile_s:.1f} s)")
                continue
            program.compile_s = time.perf_counter() - start
        _measure(program, lowered, compiled, target, cfg, analytic)
        programs.append(program)
        report(
            f"[{i + 1}/{len(jobs)}] {name} {list(shape)}: compiled in {program.compile_s:.1f} s, "
            f"peak {program.peak_bytes / 2**30:.2f} GiB a chip"
        )
    return _record(cfg, target, mesh, programs, source)


def _record(cfg, target: Target, mesh: Mesh, programs: list[Program], source: str) -> dict:
    train = [p for p in programs if p.name == "train_step" and p.error is None]
    failed = [p for p in programs if not p.fits]
    estimate = sum(p.step_s_estimate for p in train) / len(train) if train else None
    return {
        "target": target.name,
        "platform": target.platform,
        "device_kind": target.chip.kind,
        "devices": target.num_devices,
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "dtype": cfg.model.dtype,
        "scan_layers": bool(cfg.model.scan_layers),
        "packing": bool(cfg.data.packing),
        "tokens_per_batch": int(cfg.data.tokens_per_batch),
        "shapes_from": source,
        "hbm_bytes": target.chip.hbm_bytes,
        "memory_budget_bytes": target.memory_budget(),
        "peak_flops_per_chip": target.peak_flops(cfg.model.dtype),
        "fits": not failed,
        "does_not_fit": [p.error for p in failed],
        "peak_bytes_max": max((p.peak_bytes for p in programs), default=0),
        "compile_s_total": sum(p.lower_s + p.compile_s for p in programs),
        "programs": [dataclasses.asdict(p) for p in programs],
        # the mean over the train shapes: each holds about data.tokens_per_batch tokens a side
        "step_s_estimate": estimate,
        "mfu_estimate": sum(p.mfu_estimate for p in train) / len(train) if train else None,
        "train_flops_per_chip": sum(p.flops_per_chip for p in train) / len(train) if train else 0,
    }
