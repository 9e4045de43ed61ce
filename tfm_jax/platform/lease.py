"""One writer per workdir: `train` holds `<workdir>/train.lease` while it runs.

The lease is a small JSON record saying who holds the workdir (host, process id, number of
processes, SLURM job if any, when it started, when it was last renewed) and a random token. A
second `train` on the same workdir reads it and refuses with one line naming the holder,
unless the lease is stale:
- not renewed for `ttl` seconds (the holder renews it every ttl/4 from a thread), which is
  how a lost node or a frozen process lets go; hosts' clocks are assumed to agree to well under
  `ttl` (NTP), or
- held by a process id on this very host that no longer exists (kill -9): taken over at once.
Taking over a stale lease logs a warning naming the old holder and why. A clean exit (success,
an error, SIGTERM) deletes the lease, so the next run starts at once.

Every change is a compare-and-swap, so of two runs starting together exactly one wins:
- local disks and shared filesystems (NFS, Lustre, GPFS): the record is read, checked and
  replaced (write to a temporary file, then an atomic rename) under `fcntl.flock` of
  `train.lease.lock`; a filesystem without flock gets a warning and the same check without the
  lock (two runs starting within the same few milliseconds could then both start);
- gs://: the object is written with `ifGenerationMatch` (0 = "only if it does not exist"),
  the generation preconditions GCS provides for exactly this (google-cloud-storage).
Other object stores (s3://) are not leased: a warning says so.

In a multi-process run process 0 holds the lease for the run and tells the others whether it
got it; readers (`evaluate`, `translate`, `average`, `plot`) never take it.

If the holder's lease is taken over while it still runs (its renewals failed for `ttl`: a
network partition, a suspended job), `lost` says by whom, and the training loop stops before its
next save (`check`), so two runs never both write checkpoints into one workdir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator

from tfm_jax.platform import storage

log = logging.getLogger(__name__)

LEASE_FILE = "train.lease"
DEFAULT_TTL_SECS = 120.0


class LeaseHeldError(RuntimeError):
    """Another `train` holds the workdir (or took it over); the message names it and what to do."""


@dataclasses.dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    token: str
    started: float
    renewed: float
    ttl: float
    processes: int = 1
    job: str = ""  # SLURM_JOB_ID, where there is one

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            record = json.loads(text)
            fields = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in record.items() if k in fields})
        except (ValueError, TypeError):
            return None  # an unreadable record holds nothing (a write torn by a crash)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def describe(self, now: float) -> str:
        job = f", SLURM job {self.job}" if self.job else ""
        many = f" (process 0 of {self.processes})" if self.processes > 1 else ""
        return (
            f"host {self.host} pid {self.pid}{many}{job}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))}, renewed "
            f"{max(0.0, now - self.renewed):.0f} s ago"
        )

    def stale_reason(self, now: float, host: str, alive: Callable[[int], bool]) -> str | None:
        """Why this lease no longer holds the workdir, or None while it does."""
        if now - self.renewed > self.ttl:
            return f"not renewed for {now - self.renewed:.0f} s (more than its {self.ttl:.0f} s)"
        if self.host == host and not alive(self.pid):
            return f"process {self.pid} no longer exists on this host"
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


# ----------------------------------------------------------------------------- backends
# read() -> (text or None, version); replace(text, version) -> the new version, and
# delete(version) -> bool, succeed only if the record is still at `version` (compare-and-swap).


class _LocalRecord:
    def __init__(self, path: str):
        self.path = path
        self._warned = False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                if not self._warned:
                    log.warning(
                        "%s.lock cannot be locked (%s): the workdir lease is checked without "
                        "the lock, so two runs starting at the same instant might both start",
                        self.path,
                        e,
                    )
                    self._warned = True
            yield
        finally:
            os.close(fd)  # releases the flock

    def _read(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def read(self) -> tuple[str | None, str | None]:
        with self._locked():
            text = self._read()
        return text, text

    def replace(self, text: str, version: str | None) -> str | None:
        with self._locked():
            if self._read() != version:
                return None
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # readers see the old record or the new one, whole
            return text

    def delete(self, version: str | None) -> bool:
        with self._locked():
            if self._read() != version:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            return True


class _GcsRecord:
    def __init__(self, url: str):
        from google.api_core import exceptions
        from google.cloud import storage as gcs

        bucket, _, name = url[len("gs://") :].partition("/")
        self._blob = gcs.Client().bucket(bucket).blob(name)
        self._failed = exceptions

    def read(self) -> tuple[str | None, int]:
        try:
            self._blob.reload()
            text = self._blob.download_as_text(if_generation_match=self._blob.generation)
            return text, int(self._blob.generation)
        except (self._failed.NotFound, self._failed.PreconditionFailed):
            return None, 0  # absent, or replaced between the two calls: read again later

    def replace(self, text: str, version: int) -> int | None:
        try:
            self._blob.upload_from_string(
                text, content_type="application/json", if_generation_match=version
            )
            return int(self._blob.generation)
        except self._failed.PreconditionFailed:
            return None

    def delete(self, version: int) -> bool:
        try:
            self._blob.delete(if_generation_match=version)
            return True
        except (self._failed.NotFound, self._failed.PreconditionFailed):
            return False


def _record(path: str):
    if path.startswith("gs://"):
        storage.path(path)  # a StorageError naming the gcs extra if it is not installed
        return _GcsRecord(path)
    if storage.is_remote(path):
        return None
    return _LocalRecord(path)


# ----------------------------------------------------------------------------- the lease


class WorkdirLease:
    """The lease on one workdir, for one process (see the module docstring).

    `acquire()` takes it or raises LeaseHeldError; while held a thread renews it every ttl/4;
    `release()` deletes it if it is still ours. `lost` is None while held, else why not.
    """

    def __init__(
        self,
        workdir: str,
        *,
        ttl: float = DEFAULT_TTL_SECS,
        processes: int = 1,
        clock: Callable[[], float] = time.time,
        host: str | None = None,
        pid: int | None = None,
        alive: Callable[[int], bool] = _pid_alive,
    ):
        if ttl <= 0:
            raise ValueError(f"the lease's ttl must be > 0 seconds, got {ttl}")
        self.path = storage.join(workdir, LEASE_FILE)
        self.workdir, self.ttl, self.processes = workdir, float(ttl), processes
        self._clock, self._alive = clock, alive
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.token = secrets.token_hex(8)
        self._record = _record(self.path)
        self._version = None
        self._held: Holder | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking and giving back

    def acquire(self, wait_secs: float = 0.0, poll_secs: float = 5.0) -> None:
        """Takes the lease, waiting up to `wait_secs` for a live holder to let go."""
        if self._record is None:
            log.warning(
                "%s: object storage without generation preconditions; the workdir is not "
                "leased, so nothing stops a second `train` from writing into it",
                self.workdir,
            )
            return
        deadline = self._clock() + wait_secs
        while True:
            holder = self._try_acquire()
            if holder is None:
                return
            if self._clock() >= deadline:
                raise self._held_error(holder, wait_secs)
            log.info("Waiting for the workdir lease held by %s", holder.describe(self._clock()))
            time.sleep(max(0.05, min(poll_secs, deadline - self._clock())))

    def _try_acquire(self) -> Holder | None:
        """Takes the lease if free or stale (None), else returns the live holder."""
        for _ in range(5):  # another run may change the record between our read and write
            text, version = self._record.read()
            now = self._clock()
            old = Holder.parse(text) if text is not None else None
            why = None
            if old is not None and old.token != self.token:
                why = old.stale_reason(now, self.host, self._alive)
                if why is None:
                    return old
            mine = Holder(
                host=self.host,
                pid=self.pid,
                token=self.token,
                started=now,
                renewed=now,
                ttl=self.ttl,
                processes=self.processes,
                job=os.environ.get("SLURM_JOB_ID", ""),
            )
            written = self._write(mine, version)
            if written:
                if old is not None:
                    log.warning(
                        "Took over the workdir lease %s from %s: %s",
                        self.path,
                        old.describe(now),
                        why,
                    )
                elif text is not None:
                    log.warning("Replaced an unreadable workdir lease %s", self.path)
                self._start_renewing()
                return None
        raise LeaseHeldError(
            f"the workdir lease {self.path} kept changing while this run tried to take it: "
            "another `train` is starting on this workdir. Stop one of them"
        )

    def _held_error(self, holder: Holder, waited: float) -> LeaseHeldError:
        now = self._clock()
        after = f" (waited {waited:.0f} s)" if waited else ""
        return LeaseHeldError(
            f"workdir {self.workdir} is in use by another `train`: {holder.describe(now)}{after}. "
            "Two runs must not write one workdir: wait for it to finish, stop it, or train "
            f"into another --workdir. If it is dead its lease ({self.path}) expires "
            f"{max(0.0, holder.renewed + holder.ttl - now):.0f} s from now; "
            "--config.train.lease_wait_secs=N waits that long for it"
        )

    def _write(self, holder: Holder, version) -> bool:
        new = self._record.replace(holder.to_json(), version)
        if new is None:
            return False  # another run changed it since we read it
        self._held, self._version = holder, new
        return True

    def release(self) -> None:
        """Stops renewing and deletes the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._record is None or self._held is None or self.lost:
            return
        text, version = self._record.read()
        held = Holder.parse(text) if text is not None else None
        if held is not None and held.token == self.token:
            if not self._record.delete(version):
                log.info("The workdir lease %s changed as it was released", self.path)
        self._held = None

    # -- renewing

    def renew(self) -> bool:
        """Writes a fresh `renewed` time if the lease is still ours; False (and `lost` set)
        once another run holds it."""
        while True:
            text, version = self._record.read()
            held = Holder.parse(text) if text is not None else None
            if held is None or held.token != self.token:
                now = self._clock()
                self.lost = (
                    f"taken over by {held.describe(now)}"
                    if held is not None
                    else f"{self.path} was deleted"
                )
                log.error("The workdir lease was lost: %s", self.lost)
                return False
            updated = dataclasses.replace(held, renewed=self._clock())
            if self._write(updated, version):
                return True
            # it changed between the read and the write: look again

    def _start_renewing(self) -> None:
        def loop():
            while not self._stop.wait(self.ttl / 4):
                try:
                    if not self.renew():
                        return
                except Exception as e:  # noqa: BLE001 - a network blip; the next try may work
                    log.warning("Could not renew the workdir lease %s: %s", self.path, e)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="workdir-lease", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raises LeaseHeldError if the lease was taken over while this run held it."""
        if self.lost:
            raise LeaseHeldError(
                f"this run lost the lease on workdir {self.workdir} ({self.lost}); it stopped "
                "without saving so that two runs never write one workdir. Its last checkpoint "
                "is kept; stop the other run before training here again"
            )


@contextlib.contextmanager
def hold_workdir(
    workdir: str, *, ttl: float = DEFAULT_TTL_SECS, wait_secs: float = 0.0
) -> Iterator[WorkdirLease | None]:
    """The workdir's lease for a run: taken by process 0 (None on the others), with every
    process told whether it was, and released on the way out however the run ends."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    lease, error = None, None
    if jax.process_index() == 0:
        lease = WorkdirLease(workdir, ttl=ttl, processes=jax.process_count())
        try:
            lease.acquire(wait_secs)
        except LeaseHeldError as e:
            error = e
    if jax.process_count() > 1:
        got = multihost_utils.broadcast_one_to_all(np.int32(error is None))
        if not int(got) and error is None:
            error = LeaseHeldError(
                f"process 0 could not take the lease on workdir {workdir} (another `train` "
                "holds it); its log says which"
            )
    if error is not None:
        raise error
    try:
        yield lease
    finally:
        if lease is not None:
            lease.release()
