"""configs/launch/slurm.sbatch on a real SLURM cluster (munge + slurmctld + slurmd on this host,
tests/helpers/slurm.py): 2 tasks of a tiny run, preempted twice as SLURM does it (the SIGTERM of
a time limit, which the template answers by requeueing itself, then the scheduler's own
`scontrol requeue`), rerun and resumed each time; the final params must equal those of the same
job submitted without interruption. With a stand-in for `train` (fast): a stop whose tasks
finish seconds apart is still requeued, and a crashed task fails the job in bounded time.

Skips, with the reason, where SLURM cannot start (not root, no apt-get); `.ci/run` installs it
and sets TFM_JAX_REQUIRE_SLURM=1, under which not starting is a failure, not a skip.
"""

import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers import REPO, process_env
from helpers.runs import cli_args, tiny_run_config, tiny_run_overrides
from helpers.slurm import LocalSlurm, SlurmUnavailable

from tfm_jax.checkpoint import reading
from tfm_jax.train.trainer import make_trainer

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess, pytest.mark.slow]

TEMPLATE = os.path.join("configs", "launch", "slurm.sbatch")
STEPS = 120  # 240 took ~10 s longer and tested nothing more
RUN = {"train.num_steps": STEPS, "train.log_every_steps": 10, "train.eval_every_steps": 10_000,
       "train.checkpoint_every_steps": 10_000}  # fmt: skip


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as e:
        if os.environ.get("TFM_JAX_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLURM could not start: {e}")
        pytest.skip(f"SLURM cannot start here: {e}")
    yield cluster
    cluster.stop()


def submit(slurm, workdir, output, corpus) -> str:
    """The template as a user submits it from the repository root, with sbatch options in place
    of the GPU ones it is written with (this node has 2 CPUs and no GPU; --oversubscribe lets
    two such jobs share them, so the test's two run side by side)."""
    env = process_env(SLURM_CONF=slurm.conf, CONFIG="configs/small.py", WORKDIR=str(workdir),
                      ACCELERATOR_DEFAULTS="", PYTHON=sys.executable)  # fmt: skip
    argv = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
            "--cpus-per-task=1", "--oversubscribe", "--time=30", f"--output={output}", TEMPLATE,
            *cli_args(tiny_run_overrides(corpus, **RUN))]  # fmt: skip
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def attempts(output) -> list[str]:
    """The output file split by the template's per-attempt header."""
    text = output.read_text() if output.exists() else ""
    return re.split(r"^tfm_jax: job \d+ attempt \d+ .*$", text, flags=re.M)[1:]


def wait_until(what, ready, slurm, job, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready():
            return
        state = slurm.job(job).get("JobState")
        assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), (what, state)
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {slurm.job(job)}")


def reached(output, attempt, step) -> bool:
    runs = attempts(output)
    if len(runs) < attempt:
        return False
    steps = [int(m) for m in re.findall(r"^step (\d+)/", runs[attempt - 1], flags=re.M)]
    return bool(steps) and steps[-1] >= step


def finished(slurm, job) -> bool:
    return slurm.job(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def test_template_preempted_twice_resumes_to_the_uninterrupted_params(slurm, corpus, tmp_path):
    # the uninterrupted job and the same job, to be preempted twice, side by side
    out_a, out_b = tmp_path / "straight.out", tmp_path / "preempted.out"
    job_a = submit(slurm, tmp_path / "straight", out_a, corpus)
    job_b = submit(slurm, tmp_path / "preempted", out_b, corpus)
    wait_until("step 20", lambda: reached(out_b, 1, 20), slurm, job_b)
    slurm.run("scancel", "--signal=TERM", job_b)  # what --signal=TERM@120 sends at a time limit
    wait_until("the requeued attempt", lambda: reached(out_b, 2, 60), slurm, job_b)
    slurm.run("scontrol", "requeue", job_b)  # the scheduler preempts and requeues the job itself

    # the uninterrupted job: 2 processes, one log
    wait_until("the uninterrupted job", lambda: finished(slurm, job_a), slurm, job_a, 600)
    info = slurm.job(job_a)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out_a.read_text())
    log = out_a.read_text()
    assert "platform: cpu" in log and "process 0 of 2, 2 devices (1 local)" in log, log
    assert "mesh: data=2 x model=1" in log, log
    progress = re.findall(r"^step (\d+)/", log, flags=re.M)
    assert progress == [str(s) for s in range(10, STEPS + 1, 10)], progress  # one stream

    # the preempted one: stopped, requeued and resumed twice
    wait_until("the job", lambda: finished(slurm, job_b), slurm, job_b, 600)
    info = slurm.job(job_b)
    runs = attempts(out_b)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (info, out_b.read_text())
    assert len(runs) == 3, out_b.read_text()
    first_stop = re.search(r"SIGTERM: stopped at step (\d+) of", runs[0])
    assert first_stop and "requeueing job" in runs[0], runs[0]
    assert f"Resumed from step {first_stop.group(1)} in" in runs[1], runs[1]
    second_stop = re.search(r"SIGTERM: stopped at step (\d+) of", runs[1])
    assert second_stop and int(second_stop.group(1)) >= 60, runs[1]
    assert f"Resumed from step {second_stop.group(1)} in" in runs[2], runs[2]
    assert re.findall(r"^step (\d+)/", runs[2], flags=re.M)[-1] == str(STEPS)

    cfg = tiny_run_config(corpus, **RUN)
    abstract = make_trainer(cfg).abstract_state.params
    a = jax.device_get(reading.load_params(tmp_path / "straight", str(STEPS), abstract))
    b = jax.device_get(reading.load_params(tmp_path / "preempted", str(STEPS), abstract))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


# A stand-in for `python -m tfm_jax train` in each task: how it exits, not what it trains.
# "stagger": on the first attempt task 1 stops at once and task 0 3 s later, both 75 (a real
# preemption's tasks finish their stop at different times); a rerun exits 0. "crash": task 1
# fails (1) while task 0 hangs, as in a collective whose peer died.
STUB = """#!/bin/bash
echo "stub task ${SLURM_PROCID} attempt ${SLURM_RESTART_COUNT:-0}"
if [ "${STUB_MODE}" = crash ]; then
    [ "${SLURM_PROCID}" = 1 ] && exit 1
    exec sleep 600
fi
[ "${SLURM_RESTART_COUNT:-0}" != 0 ] && exit 0
[ "${SLURM_PROCID}" = 0 ] && sleep 3
exit 75
"""


def submit_stub(slurm, tmp_path, mode, output, **env):
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = dict(slurm.env, WORKDIR=str(tmp_path / "w"), ACCELERATOR_DEFAULTS="",
               PYTHON=str(stub), STUB_MODE=mode, **env)  # fmt: skip
    argv = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
            "--cpus-per-task=1", "--time=5", f"--output={output}", TEMPLATE]  # fmt: skip
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def test_template_requeues_a_stop_whose_tasks_finish_at_different_times(slurm, tmp_path):
    """Both tasks exit 75 ("resume me"), 3 s apart: the job is requeued and the rerun completes.
    Under --kill-on-bad-exit srun killed the slower task when the first exited 75, returned
    143 and the job FAILED: once seen in CI with the machine loaded."""
    out = tmp_path / "stagger.out"
    job = submit_stub(slurm, tmp_path, "stagger", out)
    deadline = time.time() + 120
    while not finished(slurm, job) and time.time() < deadline:
        time.sleep(0.5)
    info = slurm.job(job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, out.read_text())
    first = attempts(out)[0]
    assert "requeueing job" in first, first
    assert "stub task 0 attempt 0" in first and "stub task 1 attempt 0" in first, first


def test_template_fails_a_crashed_task_without_waiting_for_ever(slurm, tmp_path):
    """A task that fails while the other hangs: srun ends the other STRAGGLER_SECS later and
    the job FAILS, not requeued (a crash is not a stop to resume)."""
    out = tmp_path / "crash.out"
    t0 = time.time()
    job = submit_stub(slurm, tmp_path, "crash", out, STRAGGLER_SECS="3")
    while not finished(slurm, job) and time.time() - t0 < 120:
        time.sleep(0.5)
    info = slurm.job(job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, out.read_text())
    assert "requeueing" not in out.read_text()
    assert time.time() - t0 < 60, "the hanging task was not ended"
