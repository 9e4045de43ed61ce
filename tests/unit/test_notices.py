"""platform/notices.py and what the CLI leaves there: one process's error, for the others of
its job that wait for it. An in-memory store stands in for the job's."""

import threading
import time

import pytest
from helpers.kv_store import KeyValueStore

from tfm_jax.cli import errors
from tfm_jax.config.validate import ConfigError
from tfm_jax.data import DataError
from tfm_jax.platform import notices


@pytest.fixture
def store(monkeypatch):
    store = KeyValueStore()
    monkeypatch.setattr(notices, "client", lambda: store)
    return store


def test_without_a_job_no_one_is_told():
    assert notices.client() is None  # one process: no coordination service
    assert notices.tell("x", "y") is False and notices.heard("x") is None
    assert notices.tell_failed("why") is False
    assert notices.wait_for_all("k", 2) is None


@pytest.mark.parametrize(
    "error, said",
    [
        (ConfigError("model.d_model: must be > 0"), "config error: model.d_model: must be > 0"),
        (DataError("data.dir /x: no such folder"), "data.dir /x: no such folder"),
        (OSError(28, "No space left on device"), "[Errno 28] No space left on device"),
        (KeyError("oops"), "KeyError: 'oops'"),  # a bug: its type says so
    ],
)
def test_the_cli_leaves_its_error_once_for_the_other_processes(store, error, said):
    errors.tell_the_other_processes(error)
    assert notices.heard(notices.FAILED) == f"process 0 failed: {said}"
    errors.tell_the_other_processes(DataError("a later error"))  # the first one stays
    assert notices.heard(notices.FAILED) == f"process 0 failed: {said}"


def test_an_error_caused_by_another_process_is_not_told_again(store):
    errors.tell_the_other_processes(notices.AnotherProcessFailed("process 1 failed: ..."))
    assert store.values == {}
    assert errors.report(notices.AnotherProcessFailed("x")) == 1  # one line, no traceback


def test_watching_acts_on_another_process_note_unless_the_block_ends_first(store):
    """notices.watching: the thread calls `act` with another process's note once it has been
    there `grace_s` with the block still running; not for this process's own note (it is
    ending), not when the block ends within the grace (it heard the note itself), and it stops
    with the block."""
    acted = []
    with notices.watching(acted.append, poll_s=0.01, grace_s=0.2):
        notices.tell(notices.FAILED, "process 0 failed: mine")  # this process (index 0)
        time.sleep(0.4)
    assert acted == []
    store.values.clear()
    with notices.watching(acted.append, poll_s=0.01, grace_s=0.2):
        notices.tell(notices.FAILED, "process 1 failed: RuntimeError: theirs")
        time.sleep(0.05)  # heard, within the grace: the block ends by itself
    time.sleep(0.4)
    assert acted == []
    start = time.monotonic()
    with notices.watching(acted.append, poll_s=0.01, grace_s=0.2):
        while not acted and time.monotonic() - start < 10:
            time.sleep(0.01)
    assert acted == ["process 1 failed: RuntimeError: theirs"]
    assert 0.2 <= time.monotonic() - start < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("tfm_jax watching")]


def test_watching_without_a_job_starts_nothing():
    with notices.watching(pytest.fail, poll_s=0.01):
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("tfm_jax watching")]
