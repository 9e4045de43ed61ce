"""Faults on one host of two (`jax.distributed` processes on localhost): every host must stop
at one step, each having saved it, or the others wait at the next collective until JAX's
shutdown barrier aborts them all."""

import json
import os
import resource
import signal
import subprocess

import pytest
from helpers.faults import (
    assert_clean_message,
    cli,
    close_stdout_after_step,
    failing_at_step,
    long_run_args,
    mount_tmpfs,
    two_hosts,
    wait_for_step,
)
from helpers.runs import free_port

from tfm_jax.checkpoint.manager import Checkpointer
from tfm_jax.train import preemption


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_on_one_of_two_hosts_stops_both_at_the_same_step(corpus, tmp_path):

    args = long_run_args(corpus, **{"model.dropout": 0.0})
    port = free_port()
    logs = [tmp_path / f"stdout{i}.txt" for i in range(2)]
    files = [open(log, "w") for log in logs]
    procs = [cli([*args, f"--workdir={tmp_path / 'run'}", f"--coordinator_address=localhost:{port}",
                  "--num_processes=2", f"--process_id={i}"], stdout=files[i])  # fmt: skip
             for i in range(2)]  # fmt: skip
    try:
        wait_for_step(logs[0], 6, procs[0])
        procs[1].send_signal(signal.SIGTERM)  # the scheduler takes host 1
        errs = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        for f in files:
            f.close()
    for p, err in zip(procs, errs, strict=True):
        assert p.returncode == 75, err[-3000:]
    summary = [json.loads(log.read_text().strip().splitlines()[-1]) for log in logs]
    assert summary[0]["step"] == summary[1]["step"] and summary[0]["stopped_by"] == "SIGTERM"
    steps = Checkpointer(tmp_path / "run", every_steps=0, every_secs=0,
                                    keep=5).all_steps()  # fmt: skip
    assert steps[-1] == summary[0]["step"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_when_the_leads_stdout_reader_goes_away_both_hosts_stop_at_one_saved_step(corpus, tmp_path):
    """Two hosts, the lead's stdout read by a harness that goes away: one host cannot stop alone
    (the other would hang at the save barrier), so the lead has JAX's preemption service pick a
    step; both save it and stop, the lead saying SIGPIPE (141), host 1 SIGTERM (75). Before,
    both trained on to the end of their budget with the workdir's lease held."""
    args = long_run_args(corpus, **{"model.dropout": 0.0})
    log1 = tmp_path / "stdout1.txt"
    with (
        open(log1, "w") as out1,
        two_hosts(args, tmp_path / "run", stdout0=subprocess.PIPE, stdout1=out1) as (p0, p1),
    ):
        closed_at = close_stdout_after_step(p0, 6)
        err0 = p0.communicate(timeout=300)[1]
        err1 = p1.communicate(timeout=300)[1]
    assert p0.returncode == preemption.EXIT_CODES["SIGPIPE"], err0[-3000:]
    assert p1.returncode == preemption.EXIT_CODES["SIGTERM"], err1[-3000:]
    assert_clean_message(err0, "stdout's reader went away (SIGPIPE): stopping every host")
    assert "BrokenPipe" not in err0, err0[-3000:]
    stopped = int(err0.split("SIGPIPE: stopped at step ")[1].split()[0])
    summary1 = json.loads(log1.read_text().strip().splitlines()[-1])
    assert summary1["stopped_by"] == "SIGTERM" and summary1["step"] == stopped
    assert closed_at < stopped < 100_000
    steps = Checkpointer(tmp_path / "run", every_steps=0, every_secs=0, keep=5).all_steps()
    assert steps[-1] == stopped


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_full_disk_under_the_leads_metrics_stops_both_hosts_naming_one_checkpoint(
    corpus, tmp_path
):
    """Only the lead writes metrics.jsonl. When its disk filled, it stopped alone with the right
    message, and host 1 waited for it in the next step: both then hung 5 minutes at JAX's
    shutdown barrier and were aborted (SIGABRT, a C++ trace; host 1 never said why). Now the
    lead's failure is broadcast at the step it happened and both stop at once, alike."""
    args = long_run_args(corpus, **{"model.dropout": 0.0, "train.checkpoint_every_steps": 4})
    workdir, log0 = tmp_path / "run", tmp_path / "stdout0.txt"
    with open(log0, "w") as out0, two_hosts(args, workdir, stdout0=out0) as (p0, p1):
        wait_for_step(log0, 10, p0)
        metrics, full = workdir / "metrics.jsonl", tmp_path / "full"
        os.symlink("/dev/full", full)  # every write there fails: "No space left on device"
        os.replace(full, metrics)  # at once: no moment where an append makes a new file
        errs = [p.communicate(timeout=120)[1] for p in (p0, p1)]  # not 300 s and an abort
    for p, err in zip((p0, p1), errs, strict=True):
        assert p.returncode == 1, err[-3000:]
        assert "Terminating process" not in err, err[-3000:]
    newest = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()[-1]
    message = (
        f"error: no space left on the device writing {metrics} (No space left on device); "
        f"training stopped. The newest complete checkpoint is still step {newest}. "
    )
    for err in errs:
        assert_clean_message(err, message)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_disk_too_full_for_the_next_checkpoint_stops_both_hosts_before_it(corpus, tmp_path):
    """A 2 MB disk and two hosts. A save that found the disk full failed on the lead, which
    said nothing while host 1 waited at Orbax's commit barrier: both hung for its 20-minute
    timeout (measured: still there after 10). Now process 0 checks the room before each save
    and both stop at once with the newest checkpoint complete: alike where the check (or the
    next metrics line) finds the disk full; where a save the check let through fills it (its
    estimate is the last checkpoint's size), host 1 names the lead's error (seen once in CI)."""
    disk = tmp_path / "disk"
    mount_tmpfs(disk)  # the vocabulary and ~3 checkpoints of the tiny model
    try:
        workdir = disk / "run"
        args = long_run_args(corpus, **{"model.dropout": 0.0, "train.checkpoint_every_steps": 4})
        with two_hosts(args, workdir) as (p0, p1):
            errs = [p.communicate(timeout=240)[1] for p in (p0, p1)]
        for p, err in zip((p0, p1), errs, strict=True):
            assert p.returncode == 1, err[-3000:]
        errors = [[ln for ln in err.splitlines() if ln.startswith("error: ")] for err in errs]
        assert len(errors[0]) == 1 and len(errors[1]) == 1, errors
        newest = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()[-1]
        assert_clean_message(errs[0], "training stopped. The newest complete checkpoint is "
                             f"still step {newest}. ")  # fmt: skip
        assert f"The newest complete checkpoint is still step {newest}. " in errors[1][0]
        # Mostly the check refuses the next save. Where a save fits to the last page, the next
        # metrics.jsonl line finds the disk full instead: the other agreed stop (test above)
        line = errors[0][0]
        failed = f"error: checkpoint {newest + 4} could not be saved in {workdir / 'checkpoints'} "
        if line.startswith(failed):  # the save itself found the disk full, on the lead
            assert line.startswith(failed + "(no space left on the device; "), errors
            assert errors[1][0].startswith(failed + "(process 0 failed: its part of the "
                                           "checkpoint could not be written: "), errors  # fmt: skip
            assert "(process 1 stopped waiting)); training stopped." in errors[1][0], errors
        elif line.startswith("error: no space left on the device writing "):
            assert errors[0] == errors[1], errors
            assert line.startswith(f"error: no space left on the device writing {workdir}/")
        else:
            assert errors[0] == errors[1], errors
            assert line.startswith(f"error: checkpoint {newest + 4} was not started: ")
            assert f"(the size of checkpoint {newest})" in line
        assert not [f for f in (workdir / "checkpoints").iterdir() if "tmp" in f.name]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _files_up_to(limit: int, proc) -> None:
    """`proc`'s files can no longer grow past `limit` bytes (EFBIG: Python ignores SIGXFSZ): an
    I/O error on one host that no check beforehand can see. Set from outside just after the
    start, long before the process writes anything of that size."""
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_lead_that_cannot_write_the_token_cache_stops_both_hosts(corpus, tmp_path):
    """Process 0 builds the token cache and the others poll for its files. It failed (here its
    files may not pass 100 KB) with a traceback, and host 1 kept polling: both were aborted by
    JAX's shutdown barrier at 308 s, rc -6, host 1 never saying why (its own timeout is 30 min).
    Now process 0 says what failed in one line and tells host 1 through the job's key-value
    store (platform/notices.py), which stops at once with process 0's reason."""
    args = long_run_args(corpus, **{"model.dropout": 0.0})
    workdir = tmp_path / "run"
    with two_hosts(args, workdir) as (p0, p1):
        _files_up_to(100_000, p0)
        errs = [p.communicate(timeout=120)[1] for p in (p0, p1)]  # not 308 s and an abort
    for p, err in zip((p0, p1), errs, strict=True):
        assert p.returncode == 1, err[-3000:]
        assert "Terminating process" not in err, err[-3000:]
    assert not list((workdir / "vocab" / "tokens").iterdir())  # the failed build's temp dir too
    lines = [[ln for ln in err.splitlines() if ln.startswith("error: ")] for err in errs]
    assert len(lines[0]) == len(lines[1]) == 1, lines
    cache = lines[0][0].split("could not write the token cache ")[1].split(" ")[0]
    assert cache.startswith(f"{workdir}/vocab/tokens/train-"), lines
    said = (
        f"could not write the token cache {cache} (File too large). Make room there, or set "
        'data.token_cache_dir to another folder ("": no cache, each host tokenizes in memory)'
    )
    assert lines[0] == [f"error: {said}"]
    assert lines[1] == [
        f"error: process 1 stopped waiting for the token cache {cache}: process 0 failed: {said}"
    ]
    assert_clean_message(errs[0] + errs[1])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_save_that_fails_on_the_lead_alone_stops_both_hosts(corpus, tmp_path):
    """From step 10 the lead's files may not pass 50 KB, so its part of the next checkpoint
    fails (EFBIG), which room.py cannot foresee. Host 1 waited at Orbax's write barrier and the
    lead's finalize thread at the next one: both still hung at 240 s (Orbax gives up at 1200 s).
    Now the barriers give up when a host says its part failed (checkpoint/agreement.py)."""
    args = long_run_args(corpus, **{"model.dropout": 0.0, "train.checkpoint_every_steps": 4})
    workdir, log0 = tmp_path / "run", tmp_path / "stdout0.txt"
    with open(log0, "w") as out0, two_hosts(args, workdir, stdout0=out0) as (p0, p1):
        wait_for_step(log0, 10, p0)
        _files_up_to(50_000, p0)
        errs = [p.communicate(timeout=120)[1] for p in (p0, p1)]
    for p, err in zip((p0, p1), errs, strict=True):
        assert p.returncode == 1, err[-3000:]
        assert "Terminating process" not in err, err[-3000:]
    lines = [[ln for ln in err.splitlines() if ln.startswith("error: ")] for err in errs]
    assert len(lines[0]) == len(lines[1]) == 1, lines
    newest = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()[-1]
    failed = newest + 4
    for line in (lines[0][0], lines[1][0]):
        assert line.startswith(f"error: checkpoint {failed} could not be saved in {workdir}/"), line
        assert line.endswith(
            f"training stopped. The newest complete checkpoint is still step {newest}. Fix "
            f"that, then run the same command to resume from step {newest}"
        ), line
    assert "File too large" in lines[0][0] or "Failed writing" in lines[0][0], lines[0]
    assert " (process 0 failed: its part of the checkpoint could not be written: " in lines[1][0]
    assert (
        lines[1][0]
        .split(" (process 1 stopped waiting))")[0]
        .endswith(
            lines[0][0]
            .split(f"could not be saved in {workdir / 'checkpoints'} (")[1]
            .split("); training stopped")[0]
        )
    ), lines  # host 1 says the lead's error, as the lead says it
    assert not [f for f in (workdir / "checkpoints").iterdir() if "tmp" in f.name]
    assert_clean_message(errs[0] + errs[1])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_host_without_the_data_stops_both_hosts_before_training(corpus, tmp_path):
    """Host 1 cannot see the data folder (not mounted there). It stopped with the right error,
    and process 0, which had the data, waited in Orbax's first collective until JAX's shutdown
    barrier aborted both: 5 minutes, rc -6, nothing said. Now process 0 waits for every host
    at a rendezvous before that collective, and stops there with host 1's error."""
    args = long_run_args(corpus, **{"model.dropout": 0.0})
    missing = tmp_path / "not_mounted"
    args1 = [f"--config.data.dir={missing}" if a.startswith("--config.data.dir=") else a
             for a in args]  # fmt: skip
    with two_hosts(args, tmp_path / "run", args1=args1) as (p0, p1):
        errs = [p.communicate(timeout=120)[1] for p in (p0, p1)]  # not 300 s and an abort
    for p, err in zip((p0, p1), errs, strict=True):
        assert p.returncode == 1, err[-3000:]
        assert "Terminating process" not in err, err[-3000:]
    lines = [[ln for ln in err.splitlines() if ln.startswith("error: ")] for err in errs]
    assert len(lines[1]) == 1 and str(missing) in lines[1][0], lines
    said = lines[1][0].removeprefix("error: ")
    assert lines[0] == [f"error: process 0 stopped before training: process 1 failed: {said}"]
    assert_clean_message(errs[0] + errs[1])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_host_that_fails_alone_inside_the_training_loop_stops_the_other(corpus, tmp_path):
    """Host 1 raises before step 10 (a bug or a device error there alone) while process 0 is in
    the next step's collective, which host 1 will never join. Before, host 1 printed its error
    and waited in JAX's shutdown barrier, process 0 in the collective, until both aborted at
    318 s (rc -6), process 0 saying nothing of host 1's error. Now process 0's watch for a
    failed process (notices.watching) hears host 1's note, says it in one line and joins the
    shutdown barrier: both exit 1."""
    args = long_run_args(corpus)
    with two_hosts(args, tmp_path / "run", env1=failing_at_step(10)) as (p0, p1):
        errs = [p.communicate(timeout=150)[1] for p in (p0, p1)]  # not 318 s and an abort
    for p, err in zip((p0, p1), errs, strict=True):
        assert p.returncode == 1, err[-3000:]
        assert "Terminating process" not in err, err[-3000:]
    assert errs[1].rstrip().endswith("RuntimeError: a fault on this host before step 10")
    lines = [ln for ln in errs[0].splitlines() if ln.startswith("error: ")]
    assert lines == [
        "error: process 0 stopped training: process 1 failed: RuntimeError: a fault on this host "
        "before step 10. No complete checkpoint was saved before it. Fix that, then run the same "
        "command to start again"
    ]
    assert_clean_message(errs[0])
