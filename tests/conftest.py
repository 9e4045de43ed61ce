"""Fixtures for every test: JAX on one CPU device, started before the first test, and a tiny
config. Tests are unit/ (in-process, fast) or integration/ (training runs, the CLI, other
processes); what they share is the tests/helpers package."""

import os
import shutil
import tempfile

import pytest
from helpers import TEST_XLA_FLAGS, tiny_config

_SESSION_CACHE = "TFM_JAX_TESTS_CACHE_HOME"


def pytest_configure(config):
    """JAX on the CPU with the suite's XLA flags (helpers.TEST_XLA_FLAGS), and one compilation
    cache for the session (see _jax_on_one_cpu_device), made by the controller before xdist starts
    its workers, which inherit the environment."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if TEST_XLA_FLAGS not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {TEST_XLA_FLAGS}".strip()
    if not hasattr(config, "workerinput") and _SESSION_CACHE not in os.environ:
        os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="tfm_jax-tests-cache-")
        os.environ["XDG_CACHE_HOME"] = os.environ[_SESSION_CACHE]


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and os.environ.get(_SESSION_CACHE):
        shutil.rmtree(os.environ.pop(_SESSION_CACHE), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: not an unknown hook under -p no:xdist
def pytest_xdist_auto_num_workers(config):
    """How many workers `-n auto` (setup.cfg) starts: one per core, at most 4. Each worker is a
    JAX process whose XLA already spreads a computation over every core, and many tests start
    other JAX processes: two workers overlap one's computing with the other's waiting on its
    processes; past a few they only share the cores and the memory. (os.cpu_count, as the CPU
    platform code counts cores: it exists on every OS, where sched_getaffinity is Linux's.)"""
    return max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(scope="session", autouse=True)
def _jax_on_one_cpu_device():
    """Starts JAX on one CPU device before any test: the inference CLI's --cpu_devices (default
    one per core) only applies before JAX starts, so tests that call it in-process keep this
    count. Tests that need more devices run their own process.

    It also turns the persistent compilation cache on, as every command does (init_runtime with
    the defaults: $XDG_CACHE_HOME/tfm_jax/xla, programs that took over a second). The session
    points XDG_CACHE_HOME at a folder of its own (pytest_configure), which the CLI's processes
    inherit, so the workers, the in-process tests and the commands they start compile each
    program once per session (the tests build many identical tiny models and steps), and the
    suite neither reads nor grows a user's cache: a run here starts as cold as on CI."""
    import jax

    from tfm_jax import platform

    jax.devices()
    platform.init_runtime()


@pytest.fixture
def tiny_cfg():
    return tiny_config()
