"""One `python -m tfm_jax ...` command of a Table 3 run: run from the checkout's root with its
output appended to the run's log as it comes, retried once without the CPU malloc heap tunables
when the kernel killed it, and a failure told in one line that names the log.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

from experiments import REPO
from tfm_jax.platform import host, storage


def parallel_env(parallel: int) -> dict:
    """Environment of each run when `parallel` share one accelerator: JAX would otherwise
    reserve 75% of a GPU's memory in the first process and leave the others none."""
    if parallel < 1:
        raise SystemExit(f"--parallel={parallel}: at least 1")
    if parallel == 1 or "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:
        return {}
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / parallel:.3f}"}


def run_cmd(
    args: list[str], log_path: str, env: dict | None = None, program: list[str] | None = None
) -> str:
    """Runs `python -m tfm_jax ...`, teeing output to a log; returns stdout's last line.

    A command the kernel killed (SIGKILL: on Linux most often its out-of-memory killer) while
    the CPU malloc heap tunables were on runs once more with huge pages only: the heap tunables
    hold the heap at its high-water mark, which the small preset's A32 row takes past 24 GB
    (5.0 GB with huge pages only, 1.43x the speed of no tunables, the same numbers;
    tfm_jax/platform/host.py). A train resumes from its last checkpoint.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    program = program or [sys.executable, "-m", "tfm_jax"]
    proc = _run_logged(program, args, log_path, env)
    had_tunables, retried = host.child_has_tunables(env), False
    if proc.returncode == -signal.SIGKILL and had_tunables:
        note = (
            f"`python -m tfm_jax {args[0]}` was killed (SIGKILL), most often by the kernel's "
            "out-of-memory killer; running it again with TFM_JAX_MALLOC_TUNABLES=hugepages (a "
            "smaller heap, ~5% slower CPU steps, the same numbers)"
        )
        print(f"{log_path}: {note}", flush=True)
        with open(log_path, "a") as log:
            log.write(note + "\n")
        retried = True
        proc = _run_logged(program, args, log_path, host.without_heap_tunables(env))
    if proc.returncode != 0:
        without = retried or not had_tunables
        raise RuntimeError(failure_message(args[0], proc.returncode, log_path, without))
    return proc.stdout.strip().splitlines()[-1]


def _run_logged(program: list[str], args: list[str], log_path: str, env: dict):
    """Runs one command with stderr and stdout appended to the log as they come (a run cut
    short, or a sweep killed, still shows its progress lines there)."""
    with open(log_path, "a") as log:
        log.write(f"$ python -m tfm_jax {' '.join(args)}\n")
        log.flush()
        with subprocess.Popen(
            [*program, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        ) as proc:
            lines = []
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
        return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines))


def failure_message(
    command: str, returncode: int, log_path: str, without_tunables: bool = False
) -> str:
    """What a failed `python -m tfm_jax COMMAND` says: its exit status or signal, and its log."""
    if returncode == 75:  # tfm_jax.train.preemption.EXIT_CODES["SIGTERM"]
        return (
            f"`python -m tfm_jax {command}` stopped on SIGTERM with a checkpoint (exit 75); "
            f"rerunning the sweep resumes it; see {log_path}"
        )
    if returncode >= 0:
        return f"`python -m tfm_jax {command}` failed (exit status {returncode}); see {log_path}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    msg = f"`python -m tfm_jax {command}` was killed by {name}; see {log_path}"
    if -returncode == signal.SIGKILL:
        msg += (
            ". A SIGKILL leaves no traceback: on Linux it is most often the kernel's "
            "out-of-memory killer (`dmesg` says). The log's RSS lines show the memory it "
            "reached; rerunning the sweep resumes the run from its last checkpoint"
        )
        msg += (
            ". It was killed without the CPU malloc heap tunables too: this run needs a host "
            "with more memory"
            if without_tunables
            else ", with less memory under TFM_JAX_MALLOC_TUNABLES=hugepages in the environment"
        )
    return msg


def local_log(workdir: str) -> str:
    """The run's log.txt, appended to as the commands run: in the workdir, or for a gs://
    workdir (object storage cannot append) in local scratch, copied there by `save_log`."""
    if not storage.is_remote(workdir):
        return os.path.join(workdir, "log.txt")
    digest = hashlib.sha256(workdir.encode()).hexdigest()[:12]
    local = os.path.join(storage.scratch_dir(), "logs", digest, "log.txt")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    return local


def save_log(log_path: str, workdir: str) -> None:
    if storage.is_remote(workdir) and os.path.exists(log_path):
        storage.path(log_path).copy(storage.path(storage.join(workdir, "log.txt")), overwrite=True)
