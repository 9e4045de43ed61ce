"""Every Table 3 row's train step compiled for TPU slices and GPU nodes from this CPU host: memory a
chip, fits, FLOPs, compile time, a roofline step time and MFU, beside the paper's step time.

    python -m experiments.bench.compile_table --out=experiments/results/compile_20261202 \\
        [--targets=v5e-16,v4-8,h200x8] [--rows=base,big,...] [--config.key=value ...]

One global batch of [192, 128] tokens a side (24,576 source + 24,576 target tokens: the paper's
~25k, §5.1), bf16 compute, `model.scan_layers=True` (the accelerator defaults, README), the
train step only (`python -m tfm_jax compile` adds the eval step and the data plan's shapes).
Resumable: records already in <out>.jsonl are kept and not compiled again; <out>.md is written
from the whole file at the end. Needs the compile extras: pip install -e '.[tpu,cuda12-compile]'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from experiments import REPO

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: this host runs nothing
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

TABLE3 = os.path.join(REPO, "configs", "table3.py")
SHAPE = (192, 128, 128)
DEFAULTS = {
    "model.dtype": "bfloat16",
    "model.scan_layers": "true",
    "platform.compilation_cache": "",
}
PAPER_STEP_S = {"base": 0.4, "big": 1.0}  # §5.2, on 8 P100 GPUs


def done_keys(path: str) -> set[tuple[str, str]]:
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {(r["row"], r["target"]) for r in map(json.loads, f)}


def compile_row(row: str, target_name: str, overrides: dict) -> dict:
    from tfm_jax.config.build import build_config
    from tfm_jax.platform import targets
    from tfm_jax.train import aot

    cfg = build_config(f"{TABLE3}:{row}", {**DEFAULTS, **overrides})
    target = targets.parse_target(target_name)

    def report(message):
        print(f"{row} {target_name}: {message}", file=sys.stderr, flush=True)

    r = aot.compile_for_target(cfg, target, [SHAPE], report=report, eval_step=False)
    p = r["programs"][0]
    return {
        "row": row,
        "target": target_name,
        "device_kind": r["device_kind"],
        "devices": r["devices"],
        "shape": list(SHAPE),
        "fits": r["fits"],
        "error": p["error"],
        "argument_gib": p["argument_bytes"] / 2**30,
        "temp_gib": p["temp_bytes"] / 2**30,
        "peak_gib": p["peak_bytes"] / 2**30,
        "budget_gib": r["memory_budget_bytes"] / 2**30,
        "tflop_per_chip": p["flops_per_chip"] / 1e12,
        "flops_source": p["flops_source"],
        "collectives": p["collectives"],
        "lower_s": p["lower_s"],
        "compile_s": p["compile_s"],
        "step_s_estimate": p["step_s_estimate"],
        "mfu_estimate": p["mfu_estimate"],
        "paper_step_s_8xP100": PAPER_STEP_S.get(row),
    }


def write_markdown(jsonl: str, md: str, targets: list[str]) -> None:
    with open(jsonl, encoding="utf-8") as f:
        records = list(map(json.loads, f))
    by = {(r["row"], r["target"]): r for r in records}
    rows = list(dict.fromkeys(r["row"] for r in records))
    lines = [
        "# Table 3's train steps compiled for accelerators, from a 2-core CPU host",
        "",
        "Written by `python -m experiments.bench.compile_table` (`python -m tfm_jax compile`'s "
        "machinery). "
        f"One global batch of {SHAPE[0]} x {SHAPE[1]} tokens a side (~25k, §5.1), bf16, "
        "`model.scan_layers=True`, data parallel over every chip of the target. Peak = arguments "
        "+ unaliased outputs + temporaries, a chip (GPU budget: the 75% JAX preallocates). "
        "TFLOP/chip: XLA's cost analysis on TPU; on GPU (no cost analysis) the analytic matmul "
        "count (marked *). Step and MFU are roofline estimates (max of FLOPs / peak and bytes / "
        "bandwidth; on GPU the bytes are a lower bound from the memory analysis), an upper bound "
        "on speed, not a measurement. Compile s: lowering + XLA on this host, one program at a "
        "time. The paper: 0.4 s a step (base), 1.0 s (big) on 8 P100s.",
        "",
    ]
    head = "| row |" + "".join(
        f" {t} peak GiB | fits | TFLOP/chip | compile s | est. step ms | MFU |" for t in targets
    )
    lines += [
        head + " paper s/step |",
        "|---|" + "---|---|---|---|---|---|" * len(targets) + "---|",
    ]
    for row in rows:
        cells = []
        for t in targets:
            r = by.get((row, t))
            if r is None:
                cells.append(" - | - | - | - | - | - |")
                continue
            star = "*" if r["flops_source"] != "xla" else ""
            fits = "yes" if r["fits"] else "**no**"
            cells.append(
                f" {r['peak_gib']:.2f} | {fits} | {r['tflop_per_chip']:.3f}{star} | "
                f"{r['lower_s'] + r['compile_s']:.1f} | {r['step_s_estimate'] * 1e3:.1f} | "
                f"{r['mfu_estimate']:.2f} |"
            )
        paper = PAPER_STEP_S.get(row)
        lines.append(f"| {row} |" + "".join(cells) + f" {paper if paper else ''} |")
    with open(md, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from tfm_jax.config.build import load_config_module, split_overrides

    argv, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench.compile_table", description=__doc__
    )
    p.add_argument("--out", required=True, help="path without extension: <out>.jsonl, <out>.md")
    p.add_argument("--targets", default="v5e-16,v4-8,h200x8")
    p.add_argument("--rows", default="", help="default: every row of configs/table3.py")
    args = p.parse_args(argv)
    targets = args.targets.split(",")
    rows = args.rows.split(",") if args.rows else list(load_config_module(TABLE3).ROWS)
    jsonl = args.out + ".jsonl"
    done = done_keys(jsonl)
    for target in targets:  # one target's compiler at a time
        for row in rows:
            if (row, target) in done:
                continue
            record = compile_row(row, target, overrides)
            with open(jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    write_markdown(jsonl, args.out + ".md", targets)
    print(args.out + ".md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
