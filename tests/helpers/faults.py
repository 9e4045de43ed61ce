"""What the fault tests share: the CLI in a subprocess, reading its progress, its messages."""

import contextlib
import os
import subprocess
import sys
import time

import pytest

from helpers import REPO, process_env
from helpers.runs import cli_args, free_port, killed_on_exit, tiny_run_overrides


def cli(args, stdout=subprocess.PIPE, extra_env=None, **kw):
    env = process_env(**(extra_env or {}))
    return subprocess.Popen([sys.executable, "-m", "tfm_jax", *args], cwd=REPO, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True, **kw)  # fmt: skip


def assert_clean_message(err: str, *needles: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert "Event loop is closed" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, (needle, err[-3000:])


def wait_for_step(log_path, at_least: int, proc, timeout=300) -> None:
    """Blocks until the run's progress (stdout, in a file) has passed `at_least` steps."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("step ")]
        if lines and int(lines[-1].split()[1].split("/")[0]) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {at_least}: {log_path.read_text()[-2000:]}")


def close_stdout_after_step(proc, at_least: int) -> int:
    """Reads the run's stdout to its first progress line at `at_least` steps or more, then closes
    it, as a harness that is killed does; returns that line's step."""
    for line in proc.stdout:
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= at_least:
            break
    else:
        raise AssertionError(f"the run's stdout ended before step {at_least}")
    proc.stdout.close()
    proc.stdout = None  # communicate() reads stderr only
    return int(line.split()[1].split("/")[0])


def long_run_args(corpus, **extra):
    overrides = tiny_run_overrides(corpus, **{
        "train.num_steps": 100_000, "train.log_every_steps": 2, "train.eval_every_steps": 100_000,
        "train.checkpoint_every_steps": 1000, **extra})  # fmt: skip
    return ["train", "--config=configs/small.py", *cli_args(overrides)]


def failing_at_step(step: int) -> dict:
    """The environment in which a `train` raises inside its training loop before step `step`,
    as a bug or a device error on that host alone would (helpers/fault_in_loop)."""
    return {"PYTHONPATH": os.path.join(os.path.dirname(__file__), "fault_in_loop"),
            "TFM_JAX_TEST_FAIL_AT_STEP": str(step)}  # fmt: skip


def mount_tmpfs(path, size="2m"):
    path.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill (needs root): {p.stderr.strip()}")


@contextlib.contextmanager
def two_hosts(args, workdir, stdout0=subprocess.DEVNULL, stdout1=subprocess.DEVNULL, args1=None,
              env1=None):  # fmt: skip
    """The same `train` (host 1's `args1` and environment `env1` where given) as processes 0
    and 1 of one `jax.distributed` job on localhost, host 1 started first; yields (p0, p1), both
    killed on the way out if still running."""
    host = [f"--workdir={workdir}", f"--coordinator_address=localhost:{free_port()}",
            "--num_processes=2"]  # fmt: skip
    with (
        killed_on_exit(
            cli([*(args1 or args), *host, "--process_id=1"], stdout=stdout1, extra_env=env1)
        ) as p1,  # fmt: skip
        killed_on_exit(cli([*args, *host, "--process_id=0"], stdout=stdout0)) as p0,
    ):
        yield p0, p1
