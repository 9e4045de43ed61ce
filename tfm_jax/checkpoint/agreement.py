"""Hosts that learn at once when one host's part of an async save failed.

In a multi-host save every process writes its shards on Orbax's background thread, then waits
at a barrier for all the others (`async_write_complete`, then `async_commit_complete`). A
process whose write fails (an I/O error, a quota, a file-size limit: what room.py cannot see
beforehand) never reaches it, so the others waited there for `AsyncOptions.timeout_secs`, 20
minutes, and the failed host's own finalize thread waited for them at the next barrier:
measured with two hosts on localhost, both still hung at 240 s, nothing said after the failure.

Here the barriers Orbax waits at (its `AsyncOptions.barrier_sync_fn`) are built on the job's
key-value store (platform/notices.py), and give up on a failure left there: a host whose save
thread failed leaves its error (caught from the record Orbax logs for it), as the CLI leaves
any process's error, and every barrier then stops waiting with `SaveFailedOnAHost`, naming
that host and its error. Each host then fails its save as the failed host does, and stops at
its next save or at the end.
"""

from __future__ import annotations

import collections
import logging
import threading

import jax

from tfm_jax.checkpoint import reading
from tfm_jax.platform import notices


class SaveFailedOnAHost(RuntimeError):
    """A barrier of a save gave up: a host (maybe this one) said its part failed."""


def original_error(e: BaseException) -> BaseException:
    """The error a failed save started from. On the host whose write failed, the barrier its
    finalize thread passes next gives up too, and that error replaces the first."""
    while isinstance(e, SaveFailedOnAHost) and e.__context__ is not None:
        e = e.__context__
    return e


class _Barriers:
    """`barrier_sync_fn(key=..., timeout_ms=...)`: all processes reach `key` (each time it is
    used: Orbax reuses keys), or a process failed, or the time is up."""

    def __init__(self, process: int, processes: int):
        self._process, self._processes = process, processes
        self._uses: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, *, key: str, timeout_ms: int) -> None:
        with self._lock:
            self._uses[key] += 1
            name = f"save/{key}/{self._uses[key]}"
        failed = notices.wait_for_all(name, self._processes, timeout_ms / 1000)
        if failed is not None:
            raise SaveFailedOnAHost(f"{failed} (process {self._process} stopped waiting)")


class _TellOthers(logging.Filter):
    """Leaves the notice when Orbax logs that this host's background save failed (the record
    is kept: debris.py decides what is shown)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno >= logging.ERROR
            and record.exc_info
            and "background save thread" in record.getMessage()
            and not isinstance(record.exc_info[1], SaveFailedOnAHost)
        ):
            why = reading.read_error_reason(record.exc_info[1])
            notices.tell_failed(f"its part of the checkpoint could not be written: {why}")
        return True


_installed = threading.Lock()


def barrier_sync_fn():
    """The barrier for Orbax's AsyncOptions in a multi-host job (None with one process), with
    the filter that tells the other hosts when this host's save fails installed first in line
    on Orbax's logger (before debris.py's, which drops the record)."""
    if notices.client() is None or jax.process_count() == 1:
        return None
    absl = logging.getLogger("absl")
    with _installed:
        if not any(isinstance(f, _TellOthers) for f in absl.filters):
            absl.filters.insert(0, _TellOthers())
    return _Barriers(jax.process_index(), jax.process_count())
