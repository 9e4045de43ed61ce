"""`train.profile_steps=(A, B)`: a `jax.profiler` trace of train steps A to B (both included).

Written on process 0 into <workdir>/profile/plugins/profile/<time>/: `<host>.xplane.pb` for
TensorBoard's profile plugin (`tensorboard --logdir <workdir>/profile`, with
tensorboard-plugin-profile installed) and `perfetto_trace.json.gz` for ui.perfetto.dev. Each step
is a `StepTraceAnnotation`, so the profile plugin's step-time view splits the trace by step.
The trace starts after the previous steps' work has finished and stops after step B's, so it
holds steps A to B and nothing else; a compile for a new batch shape happens before the step's
trace window opens. A run resumed past A traces from its first step up to B; one that stops
inside the window (SIGTERM, the last step) closes the trace there.
"""

from __future__ import annotations

import contextlib
import logging
import os

import jax

log = logging.getLogger(__name__)


class Profiler:
    def __init__(self, steps: tuple, workdir: str, enabled: bool):
        self.first, self.last = (int(steps[0]), int(steps[1])) if steps else (0, -1)
        self.directory = os.path.join(workdir, "profile")
        self.enabled = enabled and bool(steps)
        self.active = False

    def before(self, step: int, state) -> None:
        """Called before step `step` (1-based) is dispatched."""
        if self.enabled and not self.active and self.first <= step <= self.last:
            jax.block_until_ready(state)  # earlier steps' device work stays out of the trace
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            self.active, self.started_at = True, step

    def annotate(self, step: int):
        if not self.active:
            return contextlib.nullcontext()
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def after(self, step: int, state) -> None:
        """Called once step `step` has been dispatched."""
        if self.active and step >= self.last:
            self._stop(step, state)

    def close(self, state) -> None:
        if self.active:
            self._stop(None, state)

    def _stop(self, step: int | None, state) -> None:
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        self.active, self.enabled = False, False
        upto = f"{step}" if step is not None else "the run's last"
        log.info(
            "profile: steps %d to %s traced into %s (tensorboard --logdir %s, or its "
            "perfetto_trace.json.gz at ui.perfetto.dev)",
            self.started_at,
            upto,
            self.directory,
            self.directory,
        )
