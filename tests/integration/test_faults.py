"""Faults a long run meets, through the CLI as a user meets them: SIGTERM (one and two hosts),
a second signal during the save, resuming with a changed model, every checkpoint corrupt, bad
numbers in the config, and relative paths."""

import errno
import json
import os
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
from helpers import REPO
from helpers.faults import (
    assert_clean_message,
    cli,
    close_stdout_after_step,
    long_run_args,
    mount_tmpfs,
    wait_for_step,
)
from helpers.runs import (
    cli_args,
    killed_on_exit,
    python_lines,
    tiny_run_config,
    tiny_run_overrides,
)

from tfm_jax.checkpoint import reading
from tfm_jax.checkpoint.errors import CheckpointSaveError
from tfm_jax.checkpoint.manager import Checkpointer
from tfm_jax.cli.main import main
from tfm_jax.config import paths, validate
from tfm_jax.config.build import load_config_module
from tfm_jax.config.defaults import default_config
from tfm_jax.platform import storage
from tfm_jax.train import loop, preemption, reporting
from tfm_jax.train.trainer import make_trainer


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A finished 8-step run (checkpoints 4 and 8), trained in-process."""
    workdir = tmp_path_factory.mktemp("trained")
    loop.train_and_evaluate(tiny_run_config(corpus, **{"train.num_steps": 8}), str(workdir))
    return workdir


def params_at(workdir, step, cfg):
    abstract = make_trainer(cfg).abstract_state.params
    return jax.device_get(reading.load_params(workdir, str(step), abstract))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_resumes_bitwise(corpus, tmp_path):
    args = long_run_args(corpus)
    log = tmp_path / "stdout.txt"
    with open(log, "w") as out:
        p = cli([*args, f"--workdir={tmp_path / 'stopped'}"], stdout=out)
        wait_for_step(log, 10, p)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=300)
    assert p.returncode == preemption.EXIT_CODES["SIGTERM"] == 75, err[-3000:]  # "resume me"
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    stopped = summary["step"]
    assert summary["stopped_by"] == "SIGTERM" and 10 <= stopped < 100_000
    assert_clean_message(err, f"SIGTERM: stopped at step {stopped} ")
    assert len([ln for ln in err.splitlines() if ln.startswith("SIGTERM: stopped")]) == 1
    steps = Checkpointer(tmp_path / "stopped", every_steps=0, every_secs=0,
                                    keep=5).all_steps()  # fmt: skip
    assert steps[-1] == stopped  # the newest checkpoint is the step it stopped at

    # Resume to stopped + 6 steps; an uninterrupted run to the same step must match bitwise.
    final = stopped + 6
    more = [f"--config.train.num_steps={final}"]
    p = cli([*args, *more, f"--workdir={tmp_path / 'stopped'}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert f"Resumed from step {stopped}" in err and "train.num_steps: saved 100000" in err
    p = cli([*args, *more, f"--workdir={tmp_path / 'straight'}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    cfg = tiny_run_config(corpus)
    a, b = params_at(tmp_path / "stopped", final, cfg), params_at(tmp_path / "straight", final, cfg)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_run_whose_stdout_reader_goes_away_stops_with_a_checkpoint(corpus, tmp_path):
    """The Table 3 harness killed on its own leaves its run with a closed stdout. The next
    progress line stops the run as SIGPIPE would, but with that step saved and the workdir's
    lease let go, so nothing is lost and the sweep started again resumes it; it used to die
    there with a BrokenPipeError traceback, unsaved (or to train on as an orphan, holding the
    lease)."""
    workdir = tmp_path / "run"
    with killed_on_exit(cli([*long_run_args(corpus), f"--workdir={workdir}"])) as p:
        closed_at = close_stdout_after_step(p, 10)
        _, err = p.communicate(timeout=300)  # a run that trains on is killed, not left behind
    assert p.returncode == preemption.EXIT_CODES["SIGPIPE"] == 141, err[-3000:]
    assert_clean_message(err, "stdout's reader went away (SIGPIPE): stopping after this step")
    assert "BrokenPipe" not in err, err[-3000:]
    stopped = int(err.split("SIGPIPE: stopped at step ")[1].split()[0])
    assert closed_at < stopped < 100_000  # at the first line written after the close
    steps = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()
    assert steps[-1] == stopped


def test_a_command_whose_stdout_is_closed_exits_quietly():
    """`python -m tfm_jax params ... | head`: the reader is gone before the output; exit 141
    (a writer stopped by SIGPIPE), one quiet stderr, no traceback (Python prints two)."""
    read, write = os.pipe()
    os.close(read)
    p = cli(["params", "--config=configs/table3.py", "--json"], stdout=write)
    os.close(write)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141, err[-3000:]
    assert_clean_message(err)
    assert "BrokenPipe" not in err and "Exception ignored" not in err, err[-3000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_second_signal_exits_at_once_and_leaves_only_complete_checkpoints(corpus, tmp_path):
    workdir = tmp_path / "run"
    log = tmp_path / "stdout.txt"
    with open(log, "w") as out:
        # bigger params, so the save the second signal interrupts takes a while
        p = cli([*long_run_args(corpus, **{"model.vocab_size": 2000, "model.d_model": 256,
                                           "model.d_ff": 1024, "model.d_k": 128,
                                           "model.d_v": 128, "train.checkpoint_every_steps": 4}),
                 f"--workdir={workdir}"], stdout=out)  # fmt: skip
        wait_for_step(log, 6, p)
        # Step 4's async save must be committed first: a second signal during that save would
        # (rightly) leave no checkpoint at all, which is not what this test is about.
        deadline = time.monotonic() + 120
        while not (workdir / "checkpoints" / "4" / "commit_success.txt").exists():
            assert time.monotonic() < deadline and p.poll() is None, "step 4 was never committed"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        line = ""
        while "stopping after this step" not in line:
            line = p.stderr.readline()
            assert line, "the process ended without acknowledging SIGTERM"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
    # Either the save was already done (75) or the second signal cut it short (128 + SIGINT).
    assert p.returncode in (75, 128 + signal.SIGINT), err[-3000:]
    if p.returncode:
        assert "SIGINT again: exiting now" in err
    big = {"model.vocab_size": 2000, "model.d_model": 256, "model.d_ff": 1024,
           "model.d_k": 128, "model.d_v": 128}  # fmt: skip
    cfg = tiny_run_config(corpus, **big)
    ckpt = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5)
    steps = ckpt.all_steps()
    assert steps, "no checkpoint at all"
    for step in steps:  # every checkpoint Orbax lists restores
        params_at(workdir, step, cfg)
    ckpt.close()


@pytest.mark.multiprocess
def test_resume_with_a_changed_model_is_a_clear_error(corpus, trained):
    args = ["train", "--config=configs/small.py", f"--workdir={trained}",
            *cli_args(tiny_run_overrides(corpus, **{"train.num_steps": 8,
                                                    "model.d_model": 64}))]  # fmt: skip
    p = cli(args)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2, err[-3000:]
    assert_clean_message(err, "cannot resume", "model.d_model: saved 32, now 64",
                         "--config.model.d_model=32")  # fmt: skip
    assert "restore failed" not in err  # decided from the saved config, before any restore


def test_resume_keys_are_classified(corpus, trained):
    from tfm_jax.train import resume

    saved = reading.read_config_json(trained)
    cfg = tiny_run_config(corpus, **{"train.num_steps": 99, "decode.alpha": 1.0,
                                     "optim.lr_factor": 2.0, "model.num_heads": 4,
                                     "model.d_k": 8, "model.d_v": 8,
                                     "optim.accumulate_steps": 2})  # fmt: skip
    refused, safe, other = resume.compare(saved, cfg)
    assert {k for k, _, _ in refused} == {"model.num_heads", "model.d_k", "model.d_v",
                                          "optim.accumulate_steps"}  # fmt: skip
    assert {"train.num_steps", "decode.alpha"} <= {k for k, _, _ in safe}
    assert {k for k, _, _ in other} == {"optim.lr_factor"}
    # switching gradient clipping on changes the optimizer state's structure
    cfg = tiny_run_config(corpus, **{"optim.grad_clip_norm": 1.0})
    assert [k for k, _, _ in resume.compare(saved, cfg)[0]] == ["optim.grad_clip_norm"]


@pytest.mark.multiprocess
def test_every_checkpoint_corrupt_is_a_clear_error(corpus, trained, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    for f in (workdir / "checkpoints").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"garbage")  # config items too: the resume check must cope
    args = ["train", "--config=configs/small.py", f"--workdir={workdir}",
            *cli_args(tiny_run_overrides(corpus, **{"train.num_steps": 8}))]  # fmt: skip
    p = cli(args)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert_clean_message(err, "No checkpoint in", "could be restored", "step 8:", "step 4:",
                         "move them aside")  # fmt: skip


def test_every_numeric_key_has_a_range_and_out_of_range_is_an_error(capsys):
    keys = set(validate.numeric_keys(default_config()))
    assert keys == set(validate.RANGES), keys ^ set(validate.RANGES)
    for key, bad in (("train.num_steps", -5), ("model.dropout", 1.5), ("mesh.data", 0),
                     ("optim.eps", 0.0), ("decode.beam_size", 0)):  # fmt: skip
        argv = ["train", "--config=configs/small.py", "--workdir=unused", f"--config.{key}={bad}"]
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and f"config key {key}={bad!r} is out of range" in err, err
        assert "must be" in err and f"--config.{key}=" in err
    cfg = default_config()
    validate.validate(cfg)  # the defaults are in range
    table3 = load_config_module(os.path.join(REPO, "configs", "table3.py"))
    for row in table3.ROWS:
        validate.validate(table3.row_config(row))


def test_paths_are_resolved_once_and_recorded(tmp_path, monkeypatch):
    assert paths.resolve("gs://bucket/runs/x") == "gs://bucket/runs/x"
    assert paths.resolve(None) is None and paths.resolve("") == ""
    monkeypatch.chdir(tmp_path)
    assert paths.resolve("runs/a") == str(tmp_path / "runs" / "a")
    assert paths.resolve("~/x") == os.path.expanduser("~/x")
    cfg = default_config()
    cfg.data.dir = "../data"
    paths.resolve_config_paths(cfg, workdir="runs/a")
    assert cfg.data.dir == str(tmp_path.parent / "data")
    assert cfg.paths.typed.data_dir == "../data" and cfg.paths.typed.workdir == "runs/a"
    assert cfg.paths.workdir == str(tmp_path / "runs" / "a") and cfg.paths.cwd == str(tmp_path)
    monkeypatch.chdir(tmp_path / "..")
    paths.resolve_config_paths(cfg)  # a saved config read back elsewhere: unchanged
    assert cfg.data.dir == str(tmp_path.parent / "data") and cfg.paths.typed.data_dir == "../data"


def test_translate_and_evaluate_take_relative_paths(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.symlink(trained, tmp_path / "run")
    (tmp_path / "in.txt").write_text("a dog runs\ntwo men\n")
    rc = main(["translate", "--workdir=run", "--checkpoint=latest", "--input=in.txt",
               "--output=out/../out.txt"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert len((tmp_path / "out.txt").read_text().split("\n")) == 3
    rc = main(["evaluate", "--workdir=run", "--checkpoint=4", "--split=validation",
               "--out=scores", "--config.decode.max_extra_len=4"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "scores" / "scores.json").read_text())["checkpoint"] == "4"


# ----------------------------------------------------------------------------- shared clusters


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_trains_on_one_workdir_the_second_refuses_and_a_dead_holder_does_not_block(
    corpus, tmp_path
):
    workdir = tmp_path / "run"
    args = [*long_run_args(corpus), f"--workdir={workdir}"]
    log = tmp_path / "first.txt"
    with open(log, "w") as out, killed_on_exit(cli(args, stdout=out)) as first:
        wait_for_step(log, 4, first)
        second = cli(args)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 1, err[-3000:]
        assert_clean_message(err, f"workdir {workdir} is in use by another `train`: host ",
                             f" pid {first.pid}, started ", "lease_wait_secs")  # fmt: skip
        assert len(python_lines(err)) == 1, err  # nothing else, not even a log line
        assert first.poll() is None  # the holder trains on, untouched
        wait_for_step(log, 8, first)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 75, err[-3000:]
    stopped = json.loads(log.read_text().strip().splitlines()[-1])["step"]
    cfg = tiny_run_config(corpus)
    params_at(workdir, stopped, cfg)  # its newest checkpoint restores
    assert not (workdir / "train.lease").exists()  # released on the way out

    # kill -9: no release. The next run on this host takes the lease over at once, saying so.
    log = tmp_path / "killed.txt"
    with open(log, "w") as out, killed_on_exit(cli(args, stdout=out)) as killed:
        wait_for_step(log, stopped + 2, killed)
        killed.kill()
        killed.wait(timeout=60)
    assert json.loads((workdir / "train.lease").read_text())["pid"] == killed.pid
    start = time.time()
    p = cli([*args, f"--config.train.num_steps={stopped + 2}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert_clean_message(err, "Took over the workdir lease", f"pid {killed.pid}",
                         f"process {killed.pid} no longer exists on this host")  # fmt: skip
    assert time.time() - start < 120  # not the lease's TTL (120 s) plus a run


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_stops_with_one_line(corpus, trained, tmp_path):
    disk = tmp_path / "disk"
    mount_tmpfs(disk)  # a 2 MB filesystem: the vocabulary and ~3 checkpoints of the tiny model
    try:
        workdir = disk / "run"
        p = cli([*long_run_args(corpus, **{"train.checkpoint_every_steps": 4}),
                 f"--workdir={workdir}"])  # fmt: skip
        _, err = p.communicate(timeout=600)
        assert p.returncode == 1, err[-3000:]
        assert_clean_message(err, "The newest complete checkpoint is still step ",
                             "run the same command to resume from step ")  # fmt: skip
        assert "sys.meta_path" not in err and "RESOURCE_EXHAUSTED" not in err
        errors = [ln for ln in python_lines(err) if not ln.startswith(("INFO", "WARNING"))]
        # Mostly the check before a save finds it will not fit (checkpoint/room.py). Else a save
        # finds the disk full, or takes its last bytes and the next metrics.jsonl line finds it
        # full (the test below makes that case on purpose)
        assert len(errors) == 1, errors
        assert errors[0].startswith(("error: checkpoint ", "error: no space left on the device "
                                     f"writing {workdir / 'metrics.jsonl'} ")), errors  # fmt: skip
        newest = int(errors[0].split("is still step ")[1].split(".")[0])
        steps = Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()
        assert steps[-1] == newest  # no half-written checkpoint listed as the newest
        if errors[0].startswith("error: checkpoint "):
            assert newest < int(errors[0].split()[2])
            assert ("was not started: " in err and "(the size of checkpoint " in err) or (
                "could not be saved in" in err and "MB uncompressed" in err
            ), err[-3000:]
        left = [f.name for f in (workdir / "checkpoints").iterdir()]
        assert not [n for n in left if "tmp" in n], left  # the failed save's folder is removed

        (tmp_path / "in.txt").write_text("a dog runs\n")
        p = cli(["translate", f"--workdir={workdir}", "--checkpoint=latest",
                 f"--input={tmp_path / 'in.txt'}"])  # fmt: skip
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert f"Loaded the params of step {newest} " in err
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_disk_that_fills_under_the_metrics_stops_naming_the_newest_checkpoint(
    corpus, tmp_path, monkeypatch
):
    """The race the test above can lose, made on purpose: a save takes the disk's last bytes
    and the next metrics.jsonl line finds it full. The stop names that file and the newest
    complete checkpoint, as a failed save does; it used to be a bare "no space left"."""
    workdir = tmp_path / "run"
    append = storage.append_lines

    def full_from_step_6(p, lines):
        if str(p).endswith("metrics.jsonl") and any(ln.startswith('{"step": 6,') for ln in lines):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(p))  # as storage says it
        append(p, lines)

    monkeypatch.setattr(storage, "append_lines", full_from_step_6)
    cfg = tiny_run_config(corpus, **{"train.num_steps": 12, "train.log_every_steps": 2,
                                     "train.checkpoint_every_steps": 4})  # fmt: skip
    with pytest.raises(CheckpointSaveError) as stopped:
        loop.train_and_evaluate(cfg, str(workdir))
    assert str(stopped.value) == (
        f"no space left on the device writing {workdir / 'metrics.jsonl'} (No space left on "
        "device); training stopped. The newest complete checkpoint is still step 4. Free space "
        "on that filesystem (or move the workdir), then run the same command to resume from step 4"
    )
    assert Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps() == [4]
    assert not (workdir / "train.lease").exists()  # released on the way out


def test_a_last_metrics_flush_that_finds_the_disk_full_stops_the_same_way(
    corpus, tmp_path, monkeypatch
):
    """On a gs:// workdir metrics.jsonl is written at each save, so the last step's lines go
    out after the loop's last check; their failure is said after the loop, the same way."""
    workdir = tmp_path / "run"
    append, init = storage.append_lines, reporting.MetricsWriter.__init__

    def full_at_step_12(p, lines):
        if str(p).endswith("metrics.jsonl") and any(ln.startswith('{"step": 12,') for ln in lines):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(p))
        append(p, lines)

    def kept_as_on_gcs(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._remote, self._flush_secs = True, float("inf")  # lines wait for a save, as on gs://

    monkeypatch.setattr(storage, "append_lines", full_at_step_12)
    monkeypatch.setattr(reporting.MetricsWriter, "__init__", kept_as_on_gcs)
    cfg = tiny_run_config(corpus, **{"train.num_steps": 12, "train.log_every_steps": 2,
                                     "train.checkpoint_every_steps": 4})  # fmt: skip
    with pytest.raises(CheckpointSaveError) as stopped:
        loop.train_and_evaluate(cfg, str(workdir))
    assert str(stopped.value).startswith(
        f"no space left on the device writing {workdir / 'metrics.jsonl'} (No space left on "
        "device); training stopped. The newest complete checkpoint is still step 12."
    )
    assert Checkpointer(workdir, every_steps=0, every_secs=0, keep=5).all_steps()[-1] == 12
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(ln)["step"] for ln in lines) == 8  # flushed at the save of step 8
    assert not (workdir / "train.lease").exists()


def _damage(workdir, step):
    for f in (workdir / "checkpoints" / str(step)).rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "state" in f.parts:
            f.write_bytes(b"garbage")  # the arrays; the step's config still reads


@pytest.mark.multiprocess
@pytest.mark.slow
def test_damaged_checkpoints_under_every_command(corpus, trained, tmp_path):
    one = tmp_path / "one"  # step 8 damaged, step 4 good
    shutil.copytree(trained, one)
    _damage(one, 8)
    (tmp_path / "in.txt").write_text("a dog runs\n")
    translate = ["translate", "--checkpoint=latest", f"--input={tmp_path / 'in.txt'}"]

    p = cli([*translate, f"--workdir={one}"])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert_clean_message(err, "Using checkpoint 4 for the params: the newer checkpoint 8 "
                         "cannot be read (")  # fmt: skip
    assert len(out.splitlines()) == 1
    assert len([ln for ln in python_lines(err) if ln.startswith("WARNING")]) == 1, err

    p = cli(["evaluate", f"--workdir={one}", "--checkpoint=latest", "--split=validation",
             f"--out={tmp_path / 'scores'}", "--config.decode.max_extra_len=4"])  # fmt: skip
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert_clean_message(err, "Using checkpoint 4 for the params")

    p = cli(["attention", f"--workdir={one}", "--checkpoint=latest", "--text=a dog runs",
             f"--out={tmp_path / 'att'}"])  # fmt: skip
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert_clean_message(err, "Using checkpoint 4 for the params")

    p = cli(["average", f"--workdir={one}", "--last=2"])  # only one of the last two reads
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert_clean_message(err, "error: Asked to average the last 2 checkpoints", "only 1 of them "
                         "read (steps [4]): checkpoint 8 cannot be read (", "--last=1")  # fmt: skip
    p = cli(["average", f"--workdir={one}", "--last=1"])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["steps"] == [4]
    assert_clean_message(err, "Averaging steps [4] instead: checkpoint 8 cannot be read")

    p = cli([*translate[:1], "--checkpoint=8", *translate[2:], f"--workdir={one}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert_clean_message(err, f"error: checkpoint 8 in {one / 'checkpoints'}: cannot be read (",
                         "Pass --checkpoint=latest")  # fmt: skip
    assert len(python_lines(err)) == 1, err

    every = tmp_path / "every"  # both damaged
    shutil.copytree(trained, every)
    _damage(every, 4)
    _damage(every, 8)
    p = cli([*translate, f"--workdir={every}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert_clean_message(err, f"error: no checkpoint in {every / 'checkpoints'} can be read for "
                         "the params (step 8: cannot be read (", "step 4: cannot be read (",
                         "move them aside")  # fmt: skip
    assert len(python_lines(err)) == 1, err

    # every file overwritten, the config items too (the UnicodeDecodeError of issue 32)
    for f in (every / "checkpoints").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"\xff\xfegarbage")
    p = cli([*translate, f"--workdir={every}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    assert_clean_message(err, "error: no checkpoint in ", "can be read for the config (step 8: ")
    assert len(python_lines(err)) == 1, err
