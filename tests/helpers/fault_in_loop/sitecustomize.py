"""Started with this folder on PYTHONPATH and TFM_JAX_TEST_FAIL_AT_STEP=N (helpers.faults.
failing_at_step), a `train` raises inside its training loop before step N: a bug, or a device
error on one host alone. Python imports this module at start-up; nothing in tfm_jax knows it."""

import os

if os.environ.get("TFM_JAX_TEST_FAIL_AT_STEP"):
    from tfm_jax.train import profile

    _at, _before = int(os.environ["TFM_JAX_TEST_FAIL_AT_STEP"]), profile.Profiler.before

    def _failing(self, step, state):  # called before each step is dispatched, on every host
        if step >= _at:
            raise RuntimeError(f"a fault on this host before step {step}")
        return _before(self, step, state)

    profile.Profiler.before = _failing
