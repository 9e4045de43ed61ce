"""`python -m tfm_jax compile --config=F --target=T`: does this config fit on that hardware, and
what will a step cost there? Compiled by XLA for the target on this host (train/aot.py)."""

from __future__ import annotations

import json
import os
import sys

from tfm_jax.config.validate import ConfigError


def add_command(sub) -> None:
    p = sub.add_parser(
        "compile", help="compile the run's programs for a TPU slice / GPU node, without one"
    )
    p.add_argument("--config", required=True)
    p.add_argument(
        "--target", required=True, help="v5e-16, v4-8, v5p-64, v6e-256, 2xv5e-16, h200x8, ..."
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="train batch shapes ROWSxSxT,... (global; as `train` logs them); default: the "
        "config's worst case",
    )
    p.add_argument("--json", action="store_true", help="one JSON record on stdout")
    p.set_defaults(fn=cmd_compile)


def parse_shapes(text: str | None) -> list[tuple[int, int, int]] | None:
    if not text:
        return None
    shapes = []
    for part in text.split(","):
        try:
            rows, s, t = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ConfigError(
                f"--shapes: {part!r} is not ROWSxSxT (e.g. --shapes=192x128x128,96x256x256)"
            ) from None
        shapes.append((rows, s, t))
    return shapes


def cmd_compile(args, overrides) -> int:
    import jax

    from tfm_jax.config.build import build_config
    from tfm_jax.platform import targets
    from tfm_jax.train import aot

    # compile-only: no chip is opened, so a second libtpu process (a training job beside this
    # one on a TPU VM, or a test) is no conflict
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if "JAX_PLATFORMS" not in os.environ:
        # the host runs nothing: keep libtpu / the CUDA plugin from probing for local devices
        jax.config.update("jax_platforms", "cpu")
    try:
        target = targets.parse_target(args.target)
    except targets.TargetError as e:
        raise ConfigError(str(e)) from None
    shapes = parse_shapes(args.shapes)
    cfg = build_config(args.config, overrides)
    # compile-only devices cannot read back a persistent-cache entry: compile afresh
    cfg.platform.compilation_cache = ""

    def progress(message: str) -> None:
        print(f"compile {target.name}: {message}", file=sys.stderr, flush=True)

    try:
        record = aot.compile_for_target(cfg, target, shapes, report=progress)
    except targets.TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    record["config"] = args.config
    record["overrides"] = dict(overrides)
    if args.json:
        print(json.dumps(record))
    else:
        print(format_table(record))
    if not record["fits"]:
        print(f"does not fit: {record['does_not_fit'][0]}", file=sys.stderr)
        return 1
    return 0


def _gib(n) -> str:
    return f"{n / 2**30:.2f}"


def format_table(r: dict) -> str:
    """The record as one table: a row per program, then the totals."""
    lines = [
        f"{r['target']} ({r['devices']} x {r['device_kind']}), mesh {r['mesh']}, {r['dtype']}, "
        f"scan_layers={r['scan_layers']}, packing={r['packing']}; shapes from {r['shapes_from']}",
        f"per chip: {_gib(r['memory_budget_bytes'])} GiB usable of {_gib(r['hbm_bytes'])} GiB "
        f"HBM, {r['peak_flops_per_chip'] / 1e12:.0f} TFLOP/s peak",
        f"{'program':<11} {'rows x S x T':>14} {'args GiB':>8} {'temp GiB':>8} {'peak GiB':>8} "
        f"{'fits':>4} {'GFLOP/chip':>10} {'collectives':>22} {'compile s':>9} {'est. ms':>8} "
        f"{'MFU':>5}",
    ]
    for p in r["programs"]:
        shape = "x".join(map(str, p["shape"]))
        coll = ",".join(f"{k.split('-')[-1][:6]}:{v}" for k, v in p["collectives"].items()) or "-"
        flops = f"{p['flops_per_chip'] / 1e9:.0f}{'*' if p['flops_source'] != 'xla' else ''}"
        lines.append(
            f"{p['name']:<11} {shape:>14} {_gib(p['argument_bytes']):>8} "
            f"{_gib(p['temp_bytes']):>8} {_gib(p['peak_bytes']):>8} "
            f"{'yes' if p['fits'] else 'NO':>4} {flops:>10} {coll:>22} "
            f"{p['lower_s'] + p['compile_s']:9.1f} {p['step_s_estimate'] * 1e3:8.2f} "
            f"{p['mfu_estimate']:5.2f}"
        )
    est = r["step_s_estimate"]
    lines.append(
        f"total compile {r['compile_s_total']:.1f} s; peak {_gib(r['peak_bytes_max'])} GiB a chip; "
        f"fits: {'yes' if r['fits'] else 'NO'}; train step estimate "
        f"{est * 1e3 if est else float('nan'):.2f} ms (roofline: FLOPs / peak, bytes / bandwidth), "
        f"MFU {r['mfu_estimate'] or 0:.2f}"
    )
    if any(p["flops_source"] != "xla" for p in r["programs"]):
        lines.append(
            "* analytic matmul FLOPs (model/flops.py): this compiler gives no cost analysis, or "
            "counts a scanned layer once (model.scan_layers)"
        )
    if any(p["bytes_source"] != "xla" for p in r["programs"]):
        lines.append(
            "bytes for the estimate from the memory analysis (args + outputs + 2 x temps, a lower "
            "bound): this compiler gives no cost analysis"
        )
    return "\n".join(lines)
