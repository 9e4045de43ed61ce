"""What every benchmark prints: one JSON record a line on stdout as soon as it exists, and a
timestamped progress line on stderr at every phase (`[+12.3s] base/default: lowering the train
step`), so a run cut short still shows where its time went."""

import json
import os
import statistics
import sys
import time

# Stamps count from $BENCH_T0 (epoch seconds: gpu_check.sh exports its own start, and
# `python -m experiments.bench` sets it before its malloc re-exec), else from this import.
os.environ.setdefault("BENCH_T0", repr(time.time()))
T0 = float(os.environ["BENCH_T0"])


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def progress(message: str) -> None:
    """One timestamped line on stderr: what this process is about to do, or just did."""
    print(f"[+{time.time() - T0:.1f}s] {message}", file=sys.stderr, flush=True)


def median(xs) -> float:
    return float(statistics.median(xs))


def since(start: float) -> str:
    """Seconds since `start` (a time.perf_counter() reading), for a progress line."""
    return f"{time.perf_counter() - start:.3f} s"
