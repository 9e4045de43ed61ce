"""Runs whose workdir is a bucket, against a GCS-API server on localhost (tests/helpers/gcs.py),
through the CLI as users run it: train, SIGTERM and resume to the same params and losses as a
local run, then average, evaluate, translate, plot and attention on the gs:// workdir; a 2-process
run sharing the bucket (and its token cache); the Table 3 harness on one row. Nothing may appear
under the current directory named after the URL.

Skips, with the reason, only where the server cannot start; the test extra installs it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from etils import epath
from helpers import REPO, process_env
from helpers.gcs_server import GcsServer, GcsUnavailable
from helpers.runs import (
    cli_args,
    free_port,
    killed_on_exit,
    python_lines,
    tiny_run_config,
    tiny_run_overrides,
    write_tiny_corpus,
)

from tfm_jax.checkpoint import layout, reading
from tfm_jax.train.trainer import make_trainer

pytestmark = [pytest.mark.gcs, pytest.mark.multiprocess, pytest.mark.slow]

BUCKET = "gs://bucket"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    server = GcsServer(str(tmp_path_factory.mktemp("gcs")))
    try:
        server.start()
    except GcsUnavailable as e:
        pytest.skip(f"the GCS-API server cannot start here: {e}")
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)  # this process reads the bucket back too
    yield server
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    server.stop()


def cli(args, gcs, stdout=subprocess.PIPE, scratch=None):
    env = process_env(**gcs.env)
    if scratch:
        env["TFM_JAX_SCRATCH"] = str(scratch)  # each "host" its own local mirror
    return subprocess.Popen([sys.executable, "-m", "tfm_jax", *args], cwd=REPO, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)  # fmt: skip


def run(args, gcs, **kw):
    p = cli(args, gcs, **kw)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return out, err


def train_args(corpus, **extra):
    cadence = {"train.log_every_steps": 2, "train.eval_every_steps": 100_000,
               "train.checkpoint_every_steps": 1000}  # fmt: skip
    overrides = tiny_run_overrides(corpus, **{**cadence, **extra})
    return ["train", "--config=configs/small.py", *cli_args(overrides)]


def train_losses(text: str) -> dict[int, float]:
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def no_url_folder():
    assert not [p for p in os.listdir(REPO) if p.startswith("gs:")], os.listdir(REPO)
    assert not [p for p in os.listdir(os.getcwd()) if p.startswith("gs:")]


@pytest.fixture(scope="module")
def stopped_and_resumed(gcs, corpus, tmp_path_factory):
    """A gs:// run stopped by SIGTERM and resumed 6 steps further: (workdir, stop, final)."""
    workdir = f"{BUCKET}/run"
    log = tmp_path_factory.mktemp("logs") / "stdout.txt"
    with open(log, "w") as out:
        p = cli([*train_args(corpus, **{"train.num_steps": 100_000}), f"--workdir={workdir}"],
                gcs, stdout=out)  # fmt: skip
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            steps = [ln for ln in log.read_text().splitlines() if ln.startswith("step ")]
            if steps and int(steps[-1].split()[1].split("/")[0]) >= 10:
                break
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=300)
    assert p.returncode == 75, err[-3000:]
    stopped = json.loads(log.read_text().strip().splitlines()[-1])["step"]
    final = stopped + 6
    _, err = run([*train_args(corpus, **{"train.num_steps": final}), f"--workdir={workdir}"], gcs)
    assert f"Resumed from step {stopped} in {workdir}" in err, err[-3000:]
    return workdir, stopped, final


def test_sigterm_and_resume_on_gs_match_a_local_run(gcs, corpus, stopped_and_resumed, tmp_path):
    workdir, stopped, final = stopped_and_resumed
    local = tmp_path / "local"
    run([*train_args(corpus, **{"train.num_steps": final}), f"--workdir={local}"], gcs)
    cfg = tiny_run_config(corpus)
    abstract = make_trainer(cfg).abstract_state.params
    a = jax.device_get(reading.load_params(workdir, str(final), abstract))
    b = jax.device_get(reading.load_params(str(local), str(final), abstract))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    remote = train_losses(epath.Path(f"{workdir}/metrics.jsonl").read_text())
    straight = train_losses((local / "metrics.jsonl").read_text())
    # every logged step, but the first after the resume: its window starts at the resume
    window = min(step for step in remote if step > stopped)
    assert set(remote) == set(straight) | {stopped} or set(remote) == set(straight)
    assert {k: v for k, v in remote.items() if k not in (stopped, window)} == {
        k: v for k, v in straight.items() if k not in (stopped, window)}  # fmt: skip
    for name in ("config.json", "tensorboard"):
        assert epath.Path(f"{workdir}/{name}").exists(), name
    vocab = list(epath.Path(f"{workdir}/vocab").glob("spm_*.model"))
    tokens = list(epath.Path(f"{workdir}/vocab/tokens").iterdir())
    assert len(vocab) == 1 and len(tokens) == 1, (vocab, tokens)  # the token cache, published
    assert (tokens[0] / "meta.json").exists()
    no_url_folder()


def test_commands_on_a_gs_workdir(gcs, stopped_and_resumed, tmp_path):
    workdir, _, final = stopped_and_resumed
    out, _ = run(["average", f"--workdir={workdir}"], gcs)
    assert json.loads(out.strip().splitlines()[-1])["steps"]
    out, _ = run(["evaluate", f"--workdir={workdir}", "--split=validation",
                  "--checkpoint=averaged"], gcs)  # fmt: skip
    scores = json.loads(out.strip().splitlines()[-1])
    assert scores["bleu"] >= 0 and scores["ppl"] > 1
    saved = json.loads(epath.Path(f"{workdir}/eval/averaged/scores.json").read_text())
    assert saved["bleu"] == scores["bleu"]
    src = epath.Path(f"{BUCKET}/input.en")
    src.write_text("A man is riding a bike.\nTwo dogs play in the snow.\n")
    run(["translate", f"--workdir={workdir}", f"--input={src}",
         f"--output={BUCKET}/output.de"], gcs)  # fmt: skip
    assert len(epath.Path(f"{BUCKET}/output.de").read_text().splitlines()) == 2
    out, _ = run(["plot", f"--workdir={workdir}"], gcs)
    assert epath.Path(f"{workdir}/learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    run(["attention", f"--workdir={workdir}", "--text=A man is riding a bike."], gcs)
    pngs = list(epath.Path(f"{workdir}/attention").glob("*.png"))
    assert pngs and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    no_url_folder()


def test_a_checkpoint_copies_between_buckets_and_disk(gcs, corpus, stopped_and_resumed, tmp_path):
    """layout.copy_step (the Table 3 budget runs' continuation) from a bucket to a bucket and
    back to disk: the copies are whole checkpoints with the run's params."""
    workdir, _, final = stopped_and_resumed
    layout.copy_step(workdir, f"{BUCKET}/copied", final)
    layout.copy_step(f"{BUCKET}/copied", str(tmp_path / "local"), final)
    abstract = make_trainer(tiny_run_config(corpus)).abstract_state.params
    params = jax.device_get(reading.load_params(workdir, str(final), abstract))
    for copy in (f"{BUCKET}/copied", str(tmp_path / "local")):
        assert layout.step_incomplete_reason(layout.checkpoints_dir(copy), final) is None, copy
        copied = jax.device_get(reading.load_params(copy, str(final), abstract))
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(copied), strict=True):
            np.testing.assert_array_equal(x, y)
    no_url_folder()


def test_two_processes_share_a_gs_workdir(gcs, corpus, tmp_path):
    workdir = f"{BUCKET}/two"
    args = [*train_args(corpus, **{"train.num_steps": 6, "model.dropout": 0.0}),
            f"--workdir={workdir}"]  # fmt: skip
    port = free_port()
    procs = [cli([*args, f"--coordinator_address=localhost:{port}", "--num_processes=2",
                  f"--process_id={i}"], gcs, scratch=tmp_path / f"host{i}")  # fmt: skip
             for i in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert epath.Path(f"{workdir}/checkpoints/6").exists()
    # process 1 tokenized nothing: it copied process 0's published cache into its own mirror
    mirrored = list((tmp_path / "host1" / "tokens").rglob("meta.json"))
    assert len(mirrored) == 1, mirrored
    no_url_folder()


def test_table3_harness_one_row_on_gs(gcs, tmp_path):
    from experiments.table3 import sweep as h  # `python -m experiments.table3`'s main

    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16)
    root = f"{BUCKET}/table3"
    args = ["--preset=micro", "--rows=base", "--seeds=0", f"--root={root}",
            f"--out={tmp_path / 'out'}", f"--data_dir={corpus}"]  # fmt: skip
    assert h.main(args) == 0
    result = json.loads(epath.Path(f"{root}/base/seed0/result.json").read_text())
    assert result["ppl"] > 1 and result["dev_curve"]
    assert "$ python -m tfm_jax train" in epath.Path(f"{root}/base/seed0/log.txt").read_text()
    assert (tmp_path / "out" / "table3_micro.md").exists()
    assert h.main(args) == 0  # a second call finds the finished run in the bucket
    no_url_folder()


def test_a_gcsfs_rename_is_one_move(gcs):
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", project="test")
    fs.pipe("bucket/moving/a.txt", b"x")
    start = time.time()
    fs.mv("bucket/moving/a.txt", "bucket/moving/b.txt")
    assert time.time() - start < 5  # the server's moveTo (the emulator as released: 501, ~33 s)
    assert fs.cat("bucket/moving/b.txt") == b"x" and not fs.exists("bucket/moving/a.txt")


def test_the_workdir_lease_on_gs(gcs):
    """The lease's compare-and-swap on a bucket: ifGenerationMatch, as real GCS answers it."""
    from tfm_jax.platform import lease as workdir_lease

    clock = [1_000_000.0]
    workdir = f"{BUCKET}/leased"

    def lease(host, pid):
        return workdir_lease.WorkdirLease(workdir, ttl=60, clock=lambda: clock[0], host=host,
                                          pid=pid, alive=lambda pid: True)  # fmt: skip

    a = lease("node-a", 111)
    a.acquire()
    record = epath.Path(f"{workdir}/train.lease")
    assert json.loads(record.read_text())["host"] == "node-a"
    b = lease("node-b", 222)
    with pytest.raises(workdir_lease.LeaseHeldError, match="in use by another `train`: host "
                       "node-a pid 111"):  # fmt: skip
        b.acquire()
    a._stop.set()  # a lost node
    clock[0] += 61
    b.acquire()  # stale: taken over
    assert json.loads(record.read_text())["token"] == b.token
    assert a.renew() is False and "taken over by host node-b pid 222" in a.lost
    a.release()  # leaves b's lease alone
    assert json.loads(record.read_text())["token"] == b.token
    # of two writers that read the same generation, exactly one replaces it
    backend = workdir_lease._GcsRecord(str(record))
    text, generation = backend.read()
    assert backend.replace(text, generation) is not None
    assert backend.replace(text, generation) is None
    assert backend.replace(text, 0) is None  # "create only if absent": it exists
    b._version = backend.read()[1]
    b.release()
    assert not record.exists()


def test_a_second_train_on_a_gs_workdir_refuses(gcs, corpus, tmp_path):
    workdir = f"{BUCKET}/held"
    args = [*train_args(corpus, **{"train.num_steps": 100_000}), f"--workdir={workdir}"]
    log = tmp_path / "stdout.txt"
    with open(log, "w") as out, killed_on_exit(cli(args, gcs, stdout=out)) as first:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None:
            if [ln for ln in log.read_text().splitlines() if ln.startswith("step ")]:
                break
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()[1][-3000:]
        second = cli(args, gcs)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 1, err[-3000:]
        assert "Traceback" not in err and len(python_lines(err)) == 1, err
        assert f"workdir {workdir} is in use by another `train`: host " in err
        assert f" pid {first.pid}, started " in err
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 75, err[-3000:]
    assert not epath.Path(f"{workdir}/train.lease").exists()
    no_url_folder()
