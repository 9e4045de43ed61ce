"""Fixtures for every test: JAX on one CPU device, started before the first test, and a tiny
config. Tests are unit/ (in-process, fast) or integration/ (training runs, the CLI, other
processes); what they share is the tests/helpers package."""

import os

import pytest
from helpers import tiny_config


def pytest_configure(config):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
    count. Tests that need more devices run their own process."""
    import jax

    jax.devices()


@pytest.fixture
def tiny_cfg():
    return tiny_config()
