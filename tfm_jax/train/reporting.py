"""What the train loop reports as it goes: the steps since the last log line (`LogWindow`),
metrics.jsonl and TensorBoard (`MetricsWriter`), and the progress line (`Progress`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfm_jax.platform import host, storage

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LogWindow:
    """What the steps since the last log line add up to: the step metrics summed on the device
    (no host transfer until a log step), the real and padded token slots, steps and FLOPs."""

    sums: dict | None = None
    real: int = 0
    slots: int = 0
    steps: int = 0
    flops: float = 0.0  # batches of different shapes differ

    def add(self, step_metrics: dict, local: dict, flops: float) -> None:
        self.sums = (
            step_metrics if self.sums is None else jax.tree.map(jnp.add, self.sums, step_metrics)
        )
        self.real += int(np.count_nonzero(local["inputs"])) + int(
            np.count_nonzero(local["targets"])
        )
        self.slots += local["inputs"].size + local["targets"].size
        self.steps += 1
        self.flops += flops


class MetricsWriter:
    """One JSON line per log step in <workdir>/metrics.jsonl, plus TensorBoard event files.

    Locally each line is appended as it comes. Object storage cannot append, so on a gs://
    workdir the lines are kept and the object rewritten at most every `flush_secs` (and at
    every save and at the end: `flush`).

    A write that fails (a full disk) is kept in `failed`, not raised. With several hosts only
    the lead writes, and it must not stop alone: the others would wait for it in the next step,
    until JAX's 5-minute shutdown barrier aborted them all. Every host calls `write` at the same
    steps, so `writes` tells the loop where to ask, all hosts together, whether the lead's failed
    (loop.stop_on_a_failed_write); lines after a failure are dropped."""

    def __init__(self, workdir: str, enabled: bool, flush_secs: float = 30.0):
        self.enabled = enabled
        self.path = storage.join(workdir, "metrics.jsonl")
        self._remote, self._pending, self._flushed = storage.is_remote(workdir), [], time.time()
        self._flush_secs = flush_secs
        self._tb = None
        self.failed: OSError | None = None
        self.writes = 0  # calls to `write`: the same count on every host
        if enabled:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(storage.join(workdir, "tensorboard"))
            except ImportError as e:  # metrics.jsonl is the record; TensorBoard is a convenience
                why = " (gs:// event files need the gcs extra)" if self._remote else ""
                log.warning("no TensorBoard event files: %s is not installed%s", e.name, why)

    def flush(self) -> None:
        if self.failed is None:
            try:
                storage.append_lines(self.path, self._pending)
            except OSError as e:
                self.failed = e
        self._pending, self._flushed = [], time.time()

    def write(self, step: int, kind: str, values: dict[str, float]):
        self.writes += 1
        if not self.enabled or self.failed is not None:  # nothing after a failure, TensorBoard too
            return
        self._pending.append(json.dumps({"step": step, "kind": kind, **values}))
        if not self._remote or time.time() - self._flushed > self._flush_secs:
            self.flush()
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
            self._tb.flush()

    def close(self):
        if self.enabled:
            self.flush()
        if self._tb is not None:
            self._tb.close()


class Progress:
    """A one-line progress bar on a terminal; plain log lines elsewhere (CI, files)."""

    def __init__(self, total: int, start: int):
        self.total, self.start = total, start
        self.tty = sys.stderr.isatty() and not os.environ.get("CI")
        self.t0 = time.time()

    def update(self, step: int, m: dict[str, float]) -> bool:
        """Shows the step's line; False where stdout's reader has gone."""
        done = step - self.start
        elapsed = time.time() - self.t0
        eta = elapsed / max(done, 1) * (self.total - step)
        if "device_bytes" in m:  # an accelerator's memory, not the host's
            memory = (
                f"device {m['device_bytes'] / 2**30:.1f} GB (peak "
                f"{m['device_peak_bytes'] / 2**30:.1f} of {m['device_limit_bytes'] / 2**30:.1f})"
            )
        else:
            memory = f"RSS {m['rss_bytes'] / 2**30:.1f} GB (peak {m['peak_rss_bytes'] / 2**30:.1f})"
        line = (
            f"step {step}/{self.total} loss {m['loss']:.3f} ppl {m['ppl']:.2f} "
            f"{m['target_tokens_per_s']:.0f} tok/s {memory} ETA {eta / 60:.1f} min"
        )
        if self.tty:
            width = 20
            filled = int(width * step / max(self.total, 1))
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {line}", end="", file=sys.stderr)
            return True
        return host.print_stdout(line)

    def close(self):
        if self.tty:
            print(file=sys.stderr)
