"""What one process of a multi-host job tells the others, in the job's coordination service
(the key-value store `jax.distributed.initialize` starts on process 0's coordinator).

A process that fails alone used to leave the others waiting for it with nothing said: for the
token cache it builds (their poll's timeout, 30 minutes), at a collective (measured, two hosts
on localhost: host 1 had no data folder and said so; process 0 sat in Orbax's first barrier
until JAX's shutdown barrier aborted both at 309 s), or at a save's barrier (20 minutes).
Now the CLI leaves every error under FAILED on its way out ("process N failed: why"), and
every place that waits for other processes also watches for that note and stops with it: the
token cache poll, `wait_for_all` (the rendezvous before training's first collective), the
save barriers (checkpoint/agreement.py, which also leaves the note when a host's part of a
save fails), and `watching`, a thread beside the train steps, whose collectives cannot watch.
The store lives as long as the job, so a note is never stale from an earlier run; with one
process (no `jax.distributed`) there is no one to tell, and nothing is kept.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PREFIX = "tfm_jax/"
FAILED = "failed"  # the first error of the job's processes: "process N failed: why"
WAIT_TIMEOUT_S = 1800.0  # how long a process waits for the others at a rendezvous
_POLL_MS = 1000  # how often a waiting process looks for FAILED
GRACE_S = 20.0  # how long `watching` leaves a process that heard FAILED to stop by itself
# (a save's barrier gives up within 1 s, then the loop's cleanup writes and closes its files)


class AnotherProcessFailed(RuntimeError):
    """This process stopped because another process of its job failed (the message says which
    and why)."""


def client():
    """The job's coordination-service client, or None without `jax.distributed`."""
    if "jax" not in sys.modules:  # a CLI error before JAX started: no job to tell
        return None
    from jax._src import distributed  # where jax.experimental.multihost_utils finds it too

    return distributed.global_state.client


def _process() -> int:
    import jax

    return jax.process_index()


def tell(key: str, value: str) -> bool:
    """Leaves `value` under `key` for the job's other processes, unless a value is there (the
    first one stays); whether it was left. Best effort: it is said on the way out of a failure,
    which must stay that failure."""
    store = client()
    if store is None:
        return False
    try:
        store.key_value_set(PREFIX + key, value)
    except Exception as e:  # noqa: BLE001 - ALREADY_EXISTS (said first elsewhere), a lost coordinator
        log.info("could not leave the note %r for the other processes: %s", key, e)
        return False
    return True


def heard(key: str) -> str | None:
    """The value another process left under `key`, or None (not yet, or no job)."""
    store = client()
    if store is None:
        return None
    try:
        return store.key_value_try_get(PREFIX + key)
    except Exception:  # noqa: BLE001 - NOT_FOUND: nothing left there (yet)
        return None


def tell_failed(why: str) -> bool:
    """Leaves this process's error under FAILED, for every process that waits for it."""
    return client() is not None and tell(FAILED, f"process {_process()} failed: {why}")


def wait_for_all(key: str, processes: int, timeout_s: float = WAIT_TIMEOUT_S) -> str | None:
    """Blocks until `processes` processes have called this with `key` (once each), and returns
    None; or returns FAILED's note as soon as one is left; TimeoutError after `timeout_s`. It is
    a collective that watches for a failure, where JAX's own cannot: an increment on arrival, then
    two RPCs a second while it waits (a look for the note, and a blocking get of at most a
    second, which returns at once when everyone is there)."""
    store = client()
    if store is None:
        return None
    base = f"{PREFIX}rendezvous/{key}"
    if store.key_value_increment(base + "/arrived", 1) == processes:
        store.key_value_set(base + "/all", "")
    deadline = time.monotonic() + timeout_s
    while True:
        failed = heard(FAILED)
        if failed is not None:
            return failed
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise TimeoutError(
                f"process {_process()} waited {timeout_s:.0f} s at {key!r} for the other "
                f"processes of its job; {processes} were to come"
            )
        try:
            store.blocking_key_value_get(base + "/all", min(_POLL_MS, left_ms))
            return None
        except Exception:  # noqa: BLE001 - DEADLINE_EXCEEDED: not everyone yet
            continue


@contextlib.contextmanager
def watching(act: Callable[[str], None], poll_s: float | None = None, grace_s: float = GRACE_S):
    """For waits that cannot watch for FAILED themselves: a train step's collective, which a
    process that failed will never join. While the block runs, a thread looks for another
    process's note every `poll_s` (one try-get; 2 s, longer past 50 processes so that the
    coordinator gets about 25 looks a second in all) and, if this process is still inside the
    block `grace_s` later (the block's own waits that hear the note end it first), calls
    `act(note)`, which is to end the process. Nothing with one process."""
    store = client()
    if store is None:
        yield
        return
    import jax

    me, done = f"process {jax.process_index()} failed:", threading.Event()
    poll_s = poll_s or max(2.0, jax.process_count() / 25)

    def look() -> None:
        while not done.wait(poll_s):
            note = heard(FAILED)
            if note is not None and not note.startswith(me):  # this process's own: it is ending
                if not done.wait(grace_s):
                    act(note)
                return

    thread = threading.Thread(target=look, name="tfm_jax watching for a failed process")
    thread.daemon = True
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
