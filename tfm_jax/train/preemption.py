"""Stopping a run cleanly on SIGTERM (a scheduler taking the machine), Ctrl-C, or a closed stdout.

SLURM, Kubernetes and TPU pods send SIGTERM some time before they take a machine. The loop
finishes its step, saves that step, waits for the save to commit and returns; a second signal
while that happens exits at once. Exiting at once loses nothing: Orbax writes a checkpoint into a
`<step>.orbax-checkpoint-tmp-*` directory and renames it only when complete, so an interrupted
save is never listed, and the next run deletes its leftovers.

One process: a Python handler sets a flag the loop reads between steps. Several processes:
every host must save the same step, or Orbax's save barrier hangs, so SIGTERM is left to JAX's
preemption service (started by `jax.distributed.initialize`), which agrees on a step with the
other hosts; the loop asks `Checkpointer.reached_preemption` every step. Ctrl-C keeps Python's
default there (a KeyboardInterrupt on the one host it reaches). A closed stdout on the lead
goes through the same service (`request_everywhere`).
"""

from __future__ import annotations

import os
import signal
import threading

import jax

# By signal name. A run stopped by SIGTERM before train.num_steps exits 75 (EX_TEMPFAIL in
# sysexits.h: "try again later"), not 0, so that a scheduler or a batch script can tell a run to
# resume from a finished one: configs/launch/slurm.sbatch requeues itself on 75, and a Kubernetes
# Job or JobSet restarts a pod that exits non-zero. Ctrl-C is the shell's 128 + SIGINT.
EXIT_CODES = {"SIGTERM": 75, "SIGINT": 130, "SIGPIPE": 141}
# SIGPIPE is no signal here (Python ignores it) but its meaning: the reader of the run's stdout
# went away (a harness killed, `| head`), found by the next progress line (`request`). With
# several processes only the lead's stop says SIGPIPE; the others were stopped for it (SIGTERM).


class StopRequest:
    """Catches SIGTERM/SIGINT for the duration of a `with` block and remembers the first one
    (or the first `request`)."""

    def __init__(self):
        self.signum: int | None = None
        self._pending: int | None = None  # what this host's stop will say, once all hosts agree
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _handle(self, signum, frame):
        if self.signum is not None:
            os.write(
                2,
                f"\n{signal.Signals(signum).name} again: exiting now without finishing the "
                "checkpoint (the previous complete checkpoint is kept)\n".encode(),
            )
            os._exit(128 + signum)
        self.signum = signum
        os.write(
            2,
            f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint "
            "(send it again to exit at once)\n".encode(),
        )

    def request(self, signum: int, why: str) -> None:
        """Stops after this step with a checkpoint, as a first signal does (a no-op after one)."""
        if self.signum is None:
            self.signum = signum
            os.write(2, f"\n{why}: stopping after this step with a checkpoint\n".encode())

    def request_everywhere(self, signum: int, why: str) -> None:
        """Stops every host after this step with a checkpoint, for a reason one host found (the
        lead's stdout closed): `request` with one process, `request_on_every_host` with several."""
        if jax.process_count() == 1:
            self.request(signum, why)
        else:
            self.request_on_every_host(signum, why)

    def request_on_every_host(self, signum: int, why: str) -> None:
        """Several processes: stops every host at one step, each saving it, as SIGTERM on one
        of them does. This process sends itself SIGTERM, which JAX's preemption service (not
        Python: `__enter__` leaves it to JAX there) turns into a step every host agrees on;
        `reached_preemption` then arms the save, and this host's stop says `signum`. With the
        service turned off there is nothing to agree through: it says so, and the hosts train on."""
        if self.signum is not None or self._pending is not None:
            return
        self._pending = signum
        if not jax.config.jax_enable_preemption_service:  # SIGTERM would kill this host alone
            os.write(2, f"\n{why}: training on without progress lines, as JAX's preemption "
                     "service is off (jax_enable_preemption_service)\n".encode())  # fmt: skip
            return
        message = f"\n{why}: stopping every host at a step they agree on, with a checkpoint\n"
        os.write(2, message.encode())
        os.kill(os.getpid(), signal.SIGTERM)

    def _install(self, signums) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in signums:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._handle)

    def arm_for_save(self, signum: int) -> None:
        """Multi-host: JAX's service caught SIGTERM; from now on a signal exits at once."""
        self.signum = self.signum or self._pending or signum
        self._install((signal.SIGTERM, signal.SIGINT))

    def __enter__(self) -> StopRequest:
        if jax.process_count() == 1:
            self._install((signal.SIGTERM, signal.SIGINT))
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
