"""The training loop: resume exactness after SIGKILL, NaN stop, averaging, corrupt fallback, one
compilation (and one compile record) per batch shape, the 2-process jax.distributed run (the CLI
end to end: test_readme.py)."""

import dataclasses
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers import REPO, process_env
from helpers.runs import cli_args, free_port, tiny_run_config, tiny_run_overrides

from tfm_jax.checkpoint import reading
from tfm_jax.checkpoint.manager import Checkpointer
from tfm_jax.train import loop
from tfm_jax.train.trainer import make_trainer


def cli(args, **kw):
    env = process_env()
    return subprocess.Popen(
        [sys.executable, "-m", "tfm_jax", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def final_params(workdir, cfg):
    trainer = make_trainer(cfg)
    return jax.device_get(reading.load_params(workdir, "latest", trainer.abstract_state.params))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_resume_after_sigkill_is_bitwise_exact(corpus, tmp_path):
    overrides = tiny_run_overrides(corpus, **{"train.num_steps": 60, "train.log_every_steps": 5,
                                              "train.eval_every_steps": 1000,
                                              "train.checkpoint_every_steps": 5})  # fmt: skip
    args = ["train", "--config=configs/small.py"] + cli_args(overrides)
    straight = tmp_path / "straight"
    p = cli(args + [f"--workdir={straight}"])
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]

    killed = tmp_path / "killed"
    p = cli(args + [f"--workdir={killed}"])
    # kill -9 as soon as a checkpoint is committed, mid-run
    deadline = time.time() + 300
    ckpts = killed / "checkpoints"
    while time.time() < deadline and p.poll() is None:
        if ckpts.exists() and any(d.name.isdigit() for d in ckpts.iterdir()):
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    steps = [int(d.name) for d in ckpts.iterdir() if d.name.isdigit()]
    assert steps and max(steps) < 60, steps  # killed mid-run, after a checkpoint
    p = cli(args + [f"--workdir={killed}"])
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert "Resumed from step" in err
    # each message once: no second root handler (absl's basicConfig) doubling every line
    assert err.count("Resumed from step") == 1, err[-3000:]

    cfg = tiny_run_config(corpus, **{"train.num_steps": 60})
    a, b = final_params(straight, cfg), final_params(killed, cfg)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False):
        np.testing.assert_array_equal(x, y)  # bitwise on CPU


def diverge_from(step, monkeypatch):
    """Makes the loop's compiled train steps diverge: from `step` on (the step counted from 1),
    the state they return has NaN params and their metrics a NaN loss, as after a blow-up."""
    compile_for_shape = loop.compile_for_shape

    def poisoned(*args, **kwargs):
        compiled = compile_for_shape(*args, **kwargs)

        def run(state, batch):
            state, metrics = compiled.executable(state, batch)
            if int(jax.device_get(state.step)) >= step:
                nan = lambda x: x * np.nan  # noqa: E731  (keeps each array's sharding)
                state = state.replace(params=jax.tree.map(nan, state.params))
                metrics = {**metrics, "loss": nan(metrics["loss"])}
            return state, metrics

        return dataclasses.replace(compiled, executable=run)

    monkeypatch.setattr(loop, "compile_for_shape", poisoned)


def test_nan_stops_training_without_a_nan_checkpoint(corpus, tmp_path, monkeypatch):
    cfg = tiny_run_config(corpus, **{"train.num_steps": 12})
    diverge_from(7, monkeypatch)
    with pytest.raises(loop.NonFiniteLossError, match=r"step 8.*last good checkpoint is step 4"):
        loop.train_and_evaluate(cfg, str(tmp_path))
    # the checkpoint at step 8 (after the NaN at step 7) was never written
    assert Checkpointer(tmp_path, every_steps=0, every_secs=0, keep=5).all_steps() == [4]


def test_memory_near_the_hosts_limit_is_warned_once(corpus, tmp_path, monkeypatch, caplog):
    # A SIGKILL from the kernel leaves no traceback: the log must say beforehand.
    from tfm_jax.platform import host

    monkeypatch.setattr(host, "memory_limit_bytes", lambda: 2**20)  # 1 MB: always near it
    monkeypatch.setattr(host, "cpu_has_bf16", lambda: False)  # a CPU without bf16 instructions
    cfg = tiny_run_config(
        corpus,
        **{"train.num_steps": 4, "train.log_every_steps": 1, "model.dtype": "bfloat16"},
    )
    with caplog.at_level("WARNING", logger="tfm_jax.train.loop"):
        loop.train_and_evaluate(cfg, str(tmp_path))
    warned = [r.getMessage() for r in caplog.records if "the kernel may kill it" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("step 1: resident memory"), warned
    assert "of the 0.0 GB this process may use" in warned[0]
    messages = [r.getMessage() for r in caplog.records]
    slow_bf16 = [m for m in messages if "without bf16 instructions" in m]
    assert len(slow_bf16) == 1 and "--config.model.dtype=float32" in slow_bf16[0], slow_bf16


def test_corrupt_newest_checkpoint_falls_back_and_resumes(corpus, tmp_path):
    cfg = tiny_run_config(corpus, **{"train.num_steps": 8})
    loop.train_and_evaluate(cfg, str(tmp_path))
    newest = tmp_path / "checkpoints" / "8"
    for f in newest.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "state" in str(f):
            f.write_bytes(b"garbage")  # a half-written / corrupted newest checkpoint
    cfg = tiny_run_config(corpus, **{"train.num_steps": 12})
    run = loop.setup_run(cfg, str(tmp_path))
    assert run.start_step == 4  # restored the previous one, with a warning
    loop.train_loop(run)
    run.checkpointer.close()


@pytest.mark.multiprocess
def test_averaging_cli_equals_mean_of_inputs(corpus, tmp_path):
    cfg = tiny_run_config(corpus, **{"train.num_steps": 8})
    loop.train_and_evaluate(cfg, str(tmp_path))
    p = cli(["average", f"--workdir={tmp_path}", "--last=2"])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["steps"] == [4, 8]
    trainer = make_trainer(cfg)
    abstract = trainer.abstract_state.params
    p4, p8 = (reading.load_params(tmp_path, s, abstract) for s in ("4", "8"))
    avg = reading.load_params(tmp_path, "averaged", abstract)
    for a, x, y in zip(*(jax.tree.leaves(t) for t in (avg, p4, p8)), strict=False):
        np.testing.assert_allclose(np.asarray(a), (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6)


class ShapeRecorder:
    """The run's train iterator, noting each batch's shape as train_loop keys its compilations."""

    def __init__(self, inner):
        self.inner, self.shapes = inner, []

    def __next__(self):
        batch = next(self.inner)
        self.shapes.append(tuple(batch["inputs"].shape) + tuple(batch["targets"].shape))
        return batch

    def get_state(self):
        return self.inner.get_state()


class LowerOnly:
    """A jitted step that may be lowered but not called: a call would compile behind our back."""

    def __init__(self, jitted):
        self.jitted = jitted

    def lower(self, *args):
        return self.jitted.lower(*args)

    def __call__(self, *args):
        raise AssertionError("train_loop called the jitted step instead of its compiled one")


def test_each_batch_shape_compiles_once_with_a_compile_record(corpus, tmp_path):
    # length buckets (no packing): a few batch shapes, each of them coming more than once
    overrides = {"data.packing": False, "data.num_buckets": 3, "train.num_steps": 16}
    cfg = tiny_run_config(corpus, **overrides, **{"train.eval_every_steps": 1000})
    run = loop.setup_run(cfg, str(tmp_path))
    run.train_iter = recorder = ShapeRecorder(run.train_iter)
    run.trainer.train_step_fn = LowerOnly(run.trainer.train_step_fn)
    try:
        loop.train_loop(run)
    finally:
        run.checkpointer.close()
    shapes = recorder.shapes
    assert len(shapes) == 16 and 1 < len(set(shapes)) < len(shapes), shapes

    with open(tmp_path / "metrics.jsonl") as f:
        compiles = [r for r in map(json.loads, f) if r["kind"] == "compile"]
    first_step = {}
    for step, shape in enumerate(shapes, start=1):
        first_step.setdefault(shape, step)
    # one record per distinct shape, at the step where that shape first came
    assert len(compiles) == len(first_step)
    assert {tuple(r["shape"]): r["step"] for r in compiles} == first_step
    for r in compiles:
        assert r["lower_s"] > 0 and r["compile_s"] > 0 and r["flops"] > 0, r


@pytest.mark.multiprocess
def test_missing_data_folder_is_a_clear_message(tmp_path):
    p = cli(["train", "--config=configs/small.py", f"--workdir={tmp_path}",
             "--config.data.dir=/nonexistent/multi30k"])  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1
    assert "Traceback" not in err
    assert "/nonexistent/multi30k" in err and "tfds" in err


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_distributed_matches_one_process(corpus, tmp_path):
    # 8 packed rows a step, split 4 + 4 over two processes of one CPU device each
    overrides = tiny_run_overrides(corpus, **{
        "train.num_steps": 4, "train.log_every_steps": 1, "train.eval_every_steps": 1000,
        "train.checkpoint_every_steps": 0, "data.tokens_per_batch": 512,
        "model.dropout": 0.0,
    })  # fmt: skip
    args = ["train", "--config=configs/small.py"] + cli_args(overrides)
    single = cli(args + [f"--workdir={tmp_path / 'single'}"])
    out, err = single.communicate(timeout=600)
    assert single.returncode == 0, err[-3000:]
    port = free_port()
    procs = [
        cli(
            args
            + [
                f"--workdir={tmp_path / 'multi'}",
                f"--coordinator_address=localhost:{port}",
                "--num_processes=2",
                f"--process_id={i}",
            ]
        )  # fmt: skip
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_o, e) in zip(procs, outs, strict=False):
        assert p.returncode == 0, e[-3000:]
    # One log: process 0 alone prints progress, warnings and the first lines naming the platform
    (out0, err0), (out1, err1) = outs
    assert [ln.split()[1] for ln in out0.splitlines() if ln.startswith("step ")] == [
        "1/4", "2/4", "3/4", "4/4"]  # fmt: skip
    assert not [ln for ln in out1.splitlines() if ln.startswith("step ")], out1
    assert "platform: cpu (cpu), process 0 of 2, 2 devices (1 local)" in err0, err0
    assert "mesh: data=2 x model=1; compute: float32" in err0, err0
    # Python's records ("LEVEL logger: message"); C++ plugins' own stderr lines are not ours
    ours = re.compile(r"^(INFO|WARNING) [\w.]+: ")
    assert not [ln for ln in err1.splitlines() if ours.match(ln)], err1

    def losses(workdir):
        with open(workdir / "metrics.jsonl") as f:
            return [r["loss"] for r in map(json.loads, f) if r["kind"] == "train"]

    np.testing.assert_allclose(losses(tmp_path / "multi"), losses(tmp_path / "single"), rtol=1e-5)


def test_prepare_then_train_does_not_tokenize_the_training_split_again(
    corpus, tmp_path, monkeypatch, capsys
):
    """`prepare` builds the vocabulary and the token cache; `train` in the same workdir maps it."""
    from tfm_jax.cli.main import main
    from tfm_jax.data import token_cache

    workdir = tmp_path / "run"
    args = cli_args(tiny_run_overrides(corpus, **{"train.num_steps": 2}))
    cwd = os.getcwd()
    os.chdir(REPO)  # --config=configs/small.py is relative, as users type it
    try:
        assert main(["prepare", "--config=configs/small.py", f"--workdir={workdir}", *args]) == 0
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["pairs"] > 1000 and report["source_tokens"] > report["pairs"]
        caches = list((workdir / "vocab" / "tokens").iterdir())
        assert len(caches) == 1 and (caches[0] / "meta.json").exists(), caches

        def fail(*a, **k):
            raise AssertionError("train tokenized the training split again")

        monkeypatch.setattr(token_cache, "encode_split", fail)
        assert main(["train", "--config=configs/small.py", f"--workdir={workdir}", *args]) == 0
        # A resume (two more steps from the saved checkpoint) maps the same cache too.
        more = cli_args(tiny_run_overrides(corpus, **{"train.num_steps": 4}))
        assert main(["train", "--config=configs/small.py", f"--workdir={workdir}", *more]) == 0
    finally:
        os.chdir(cwd)
    assert list((workdir / "vocab" / "tokens").iterdir()) == caches  # the same cache, not rebuilt
    with open(workdir / "metrics.jsonl") as f:
        steps = [r["step"] for r in map(json.loads, f) if r["kind"] == "train"]
    assert steps[-1] == 4, steps


def test_profile_steps_write_a_trace_of_those_steps(corpus, tmp_path, caplog):
    cfg = tiny_run_config(corpus, **{"train.num_steps": 5, "train.profile_steps": (2, 3)})
    with caplog.at_level("INFO", logger="tfm_jax"):
        loop.train_and_evaluate(cfg, str(tmp_path))
    runs = list((tmp_path / "profile" / "plugins" / "profile").iterdir())
    assert len(runs) == 1, runs  # one trace window
    files = {f.name: f.stat().st_size for f in runs[0].iterdir()}
    xplane = [n for n in files if n.endswith(".xplane.pb")]
    assert xplane and files[xplane[0]] > 1000, files  # TensorBoard's profile plugin reads it
    assert files.get("perfetto_trace.json.gz", 0) > 100, files  # ui.perfetto.dev reads it
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("profile: steps 2 to 3 traced into") for m in messages), messages
    assert any(m.startswith("platform: cpu (") for m in messages), messages  # the first lines
    # exactly steps 2 and 3, each one StepTraceAnnotation (the profile plugin's step view)
    with gzip.open(runs[0] / "perfetto_trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted(e["args"]["step_num"] for e in events if e.get("name") == "train")
    assert steps == ["2", "3"], steps
