"""tfm_jax/platform/lease.py: one `train` per workdir, on a local disk (gs:// in
tests/integration/test_gcs_runs.py): refusal naming the holder, stale leases (TTL, a dead pid)
taken over with a warning, a lost lease detected, release only of our own, and of many
processes racing for one workdir exactly one winning."""

import ast
import json
import logging
import multiprocessing
import pathlib
import threading
import time

import pytest

from tfm_jax.platform import lease as workdir_lease
from tfm_jax.platform.lease import LeaseHeldError, WorkdirLease


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def _lease(workdir, clock, host="node-a", pid=111, alive=lambda pid: True, ttl=60.0):
    return WorkdirLease(str(workdir), ttl=ttl, clock=clock, host=host, pid=pid, alive=alive)


def _record(workdir):
    return json.loads((workdir / workdir_lease.LEASE_FILE).read_text())


def test_a_second_run_is_refused_with_the_holder_named(tmp_path):
    clock = Clock()
    a = _lease(tmp_path, clock)
    a.acquire()
    try:
        assert _record(tmp_path)["host"] == "node-a" and _record(tmp_path)["pid"] == 111
        clock.t += 20
        b = _lease(tmp_path, clock, host="node-b", pid=222)
        with pytest.raises(LeaseHeldError) as e:
            b.acquire()
        msg = str(e.value)
        assert "is in use by another `train`: host node-a pid 111" in msg
        assert "renewed 20 s ago" in msg and "expires 40 s from now" in msg
        assert "lease_wait_secs" in msg and "--workdir" in msg
        assert _record(tmp_path)["token"] == a.token  # refusing changed nothing
    finally:
        a.release()
    assert not (tmp_path / workdir_lease.LEASE_FILE).exists()
    b.acquire()  # free once released
    b.release()


def test_a_lease_not_renewed_for_its_ttl_is_taken_over_with_a_warning(tmp_path, caplog):
    clock = Clock()
    a = _lease(tmp_path, clock, ttl=60)
    a.acquire()
    a._stop.set()  # a lost node: nothing renews it any more
    b = _lease(tmp_path, clock, host="node-b", pid=222)
    clock.t += 59
    with pytest.raises(LeaseHeldError):
        b.acquire()
    clock.t += 2
    with caplog.at_level(logging.WARNING, logger=workdir_lease.__name__):
        b.acquire()
    assert "Took over the workdir lease" in caplog.text and "host node-a pid 111" in caplog.text
    assert "not renewed for 61 s (more than its 60 s)" in caplog.text
    assert _record(tmp_path)["token"] == b.token

    # the old holder finds out, stops, and its release leaves the new holder's lease alone
    assert a.renew() is False
    assert "taken over by host node-b pid 222" in a.lost
    with pytest.raises(LeaseHeldError, match="lost the lease.*stopped without saving"):
        a.check()
    a.release()
    assert _record(tmp_path)["token"] == b.token
    b.release()
    assert not (tmp_path / workdir_lease.LEASE_FILE).exists()


def test_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path, caplog):
    clock = Clock()
    a = _lease(tmp_path, clock, host="node-a", pid=111)
    a.acquire()
    a._stop.set()  # kill -9: no release
    dead = _lease(tmp_path, clock, host="node-a", pid=222, alive=lambda pid: pid != 111)
    with caplog.at_level(logging.WARNING, logger=workdir_lease.__name__):
        dead.acquire()
    assert "process 111 no longer exists on this host" in caplog.text
    # on another host the same pid says nothing: only the TTL frees it
    other = _lease(tmp_path, clock, host="node-b", pid=333, alive=lambda pid: False)
    with pytest.raises(LeaseHeldError, match="host node-a pid 222"):
        other.acquire()
    dead.release()


def test_renewal_keeps_a_live_lease_fresh(tmp_path):
    a = WorkdirLease(str(tmp_path), ttl=0.4)  # renews every 0.1 s from its thread
    a.acquire()
    try:
        first = _record(tmp_path)["renewed"]
        time.sleep(1.0)  # 2.5 TTLs: stale unless renewed
        assert _record(tmp_path)["renewed"] > first
        with pytest.raises(LeaseHeldError):
            WorkdirLease(str(tmp_path), ttl=0.4, host="elsewhere").acquire()
        assert a.lost is None
    finally:
        a.release()


def test_an_unreadable_lease_is_replaced(tmp_path, caplog):
    (tmp_path / workdir_lease.LEASE_FILE).write_text('{"host": "node-a", "pi')  # torn write
    a = _lease(tmp_path, Clock())
    with caplog.at_level(logging.WARNING, logger=workdir_lease.__name__):
        a.acquire()
    assert "Replaced an unreadable workdir lease" in caplog.text
    a.release()


def test_wait_secs_waits_for_the_holder_to_let_go(tmp_path):
    a = WorkdirLease(str(tmp_path), ttl=60)
    a.acquire()
    threading.Timer(0.5, a.release).start()
    b = WorkdirLease(str(tmp_path), ttl=60, host="elsewhere")
    start = time.time()
    b.acquire(wait_secs=20, poll_secs=0.05)
    assert 0.4 < time.time() - start < 10
    assert _record(tmp_path)["token"] == b.token
    b.release()
    c = WorkdirLease(str(tmp_path), ttl=60)
    c.acquire()
    with pytest.raises(LeaseHeldError, match=r"waited 1 s"):
        WorkdirLease(str(tmp_path), ttl=60, host="elsewhere").acquire(wait_secs=1, poll_secs=0.1)
    c.release()


def _race(workdir, start_at, results):
    lease = WorkdirLease(workdir, ttl=60)
    while time.time() < start_at:
        pass
    try:
        lease.acquire()
        results.put("won")
        time.sleep(5.0)  # hold it while the others try (they start within ~1 s)
        lease.release()
    except LeaseHeldError:
        results.put("refused")


@pytest.mark.multiprocess
def test_of_many_processes_starting_together_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 4.0  # after every process has imported
    procs = [ctx.Process(target=_race, args=(str(tmp_path), start_at, results)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    outcome = sorted(results.get(timeout=5) for _ in procs)
    assert outcome == ["refused"] * 5 + ["won"], outcome
    assert not (tmp_path / workdir_lease.LEASE_FILE).exists()


def _imports_lease(node) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module == "tfm_jax.platform.lease" or (
            node.module == "tfm_jax.platform" and any(a.name == "lease" for a in node.names)
        )
    return isinstance(node, ast.Import) and any(
        a.name == "tfm_jax.platform.lease" for a in node.names
    )


def test_only_train_takes_the_lease():
    # evaluate/translate/average/plot/attention read checkpoints through checkpoint/layout.py
    # and never import it; cli/errors.py imports only LeaseHeldError, to report it
    root = pathlib.Path(workdir_lease.__file__).parents[1]
    users = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if any(_imports_lease(n) for n in ast.walk(ast.parse(p.read_text())))
    )
    assert users == ["cli/errors.py", "train/loop.py"], users
