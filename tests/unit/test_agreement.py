"""checkpoint/agreement.py: the save barriers hosts share, which give up when one host says
its part of the save failed. Threads stand in for hosts, an in-memory store for the job's."""

import logging
import threading
import time

import pytest
from helpers.kv_store import KeyValueStore

from tfm_jax.checkpoint import agreement
from tfm_jax.platform import notices


@pytest.fixture
def store(monkeypatch):
    store = KeyValueStore()
    monkeypatch.setattr(notices, "client", lambda: store)
    monkeypatch.setattr(notices, "_POLL_MS", 20)
    return store


def _hosts(store, n):
    return [agreement._Barriers(i, n) for i in range(n)]


def _run(barrier, key, timeout_ms, out, i):
    try:
        barrier(key=key, timeout_ms=timeout_ms)
        out[i] = "passed"
    except Exception as e:  # noqa: BLE001 - what each host got is the test's result
        out[i] = e


def test_a_barrier_waits_for_every_host_and_can_be_used_again(store):
    hosts = _hosts(store, 3)
    for _ in range(2):  # Orbax passes the same key at every save
        out = {}
        threads = [threading.Thread(target=_run, args=(h, "async_write_complete", 10_000, out, i))
                   for i, h in enumerate(hosts[:2])]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(0.2)
        assert out == {}  # two of three: still waiting
        hosts[2](key="async_write_complete", timeout_ms=10_000)
        for t in threads:
            t.join(10)
        assert out == {0: "passed", 1: "passed"}


def test_a_barrier_gives_up_when_a_host_says_its_part_failed(store):
    hosts, out = _hosts(store, 2), {}
    waiting = threading.Thread(target=_run, args=(hosts[1], "async_write_complete", 60_000, out, 1))
    waiting.start()
    time.sleep(0.1)
    assert notices.tell_failed("OSError: File too large")
    start = time.monotonic()
    waiting.join(10)
    assert time.monotonic() - start < 2  # not the 60 s timeout
    assert isinstance(out[1], agreement.SaveFailedOnAHost)
    assert str(out[1]) == ("process 0 failed: OSError: File too large (process 1 stopped waiting)")


def test_a_barrier_times_out_with_a_message(store):
    (host, _) = _hosts(store, 2)
    with pytest.raises(TimeoutError, match=r"process 0 waited 0 s at 'save/k/1' for the other"):
        host(key="k", timeout_ms=100)


def test_the_host_whose_save_failed_reports_its_own_error():
    """Its finalize thread passes a barrier after the failure, which gives up too: that error
    replaces the first one, and the report must follow it back."""
    try:
        try:
            raise OSError(27, "File too large")
        finally:
            raise agreement.SaveFailedOnAHost("process 0's part failed")
    except agreement.SaveFailedOnAHost as e:
        assert isinstance(agreement.original_error(e), OSError)
    alone = agreement.SaveFailedOnAHost("process 0's part failed")  # another host's
    assert agreement.original_error(alone) is alone


def test_orbaxs_record_of_a_failed_save_tells_the_other_hosts(store):
    tell = agreement._TellOthers()
    try:
        raise ValueError("OUT_OF_RANGE: Failed writing: File too large")
    except ValueError as e:
        record = logging.LogRecord(
            "absl", logging.ERROR, "orbax/async_checkpointer.py", 1,
            "[process=0] Failed to run 1 Handler Commit operations or the Commit callback in "
            "background save thread, directory: /w/checkpoints/12.orbax-checkpoint-tmp",
            None, (type(e), e, e.__traceback__),
        )  # fmt: skip
    assert tell.filter(record)  # kept: debris.py decides what is shown
    assert notices.heard(notices.FAILED) == (
        "process 0 failed: its part of the checkpoint could not be written: ValueError: "
        "OUT_OF_RANGE: Failed writing: File too large"
    )
    other = logging.LogRecord("absl", logging.ERROR, "x.py", 1, "something else", None, None)
    assert tell.filter(other) and list(store.values) == ["tfm_jax/failed"]


def test_one_process_keeps_orbaxs_own_barriers():
    assert agreement.barrier_sync_fn() is None
