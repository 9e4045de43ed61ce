"""The Table 3 harness on two rows with the micro preset: one workdir per (row, seed), the table
and the protocol written, paper columns right, finished runs skipped and new seeds added on a
rerun, a changed budget refused, and --find_budget on a run's curve."""

import csv
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from helpers import REPO, process_env
from helpers.runs import write_tiny_corpus

from experiments.table3 import commands, presets, runner, sweep
from experiments.table3.presets import TABLE3
from tfm_jax.cli.main import main as cli_main
from tfm_jax.platform import host as hostenv
from tfm_jax.train.resume import CADENCE_KEYS


def test_small_preset_scales_every_row_alike():
    base = presets.preset_overrides("small", "base", None)
    assert base["model.d_model"] == 128 and base["model.num_layers"] == 3
    assert presets.preset_overrides("small", "C256", None)["model.d_model"] == 64
    assert presets.preset_overrides("small", "C2", None)["model.num_layers"] == 1
    assert presets.preset_overrides("small", "A1", None)["model.d_k"] == 128
    big = presets.preset_overrides("small", "big", None)
    assert big["train.num_steps"] == 3 * base["train.num_steps"]
    assert presets.preset_overrides("small", "E", None)["model.positional"] == "learned"
    assert presets.preset_overrides("paper", "B16", None)["model.d_k"] == 16


def test_small_preset_takes_its_data_settings_from_configs_small():
    o = presets.preset_overrides("small", "base", None)
    for key in ("data.source", "data.train_split", "data.eval_split", "data.test_split",
                "model.vocab_size", "model.max_len", "data.max_len", "data.packing",
                "data.packed_length", "model.dtype"):  # fmt: skip
        section, name = key.split(".")
        assert o[key] == presets.SMALL[section][name], key
    assert o["data.dir"] == os.path.join(REPO, presets.SMALL.data.dir)  # from the checkout's root
    assert presets.preset_overrides("small", "base", "/corpus")["data.dir"] == "/corpus"
    # the sweep's own departures from the quickstart's recipe
    departures = ("data.tokens_per_batch", "optim.warmup_steps", "optim.lr_factor")
    assert [o[k] for k in departures] == [8192, 100, 0.5]


def test_the_committed_small_runs_are_what_the_small_preset_starts():
    """Every committed (row, seed) result of the small sweep was started with what the preset
    gives now (keys and flag order; every value but how often it saves checkpoints, which
    decides nothing it learns, nor a checkpoint key added since), so those runs stay
    reproducible and a sweep skips them."""
    found = glob.glob(os.path.join(REPO, "experiments", "results", "table3_small_s1200_runs",
                                   "*", "seed*", "result.json"))  # fmt: skip
    assert found
    for path in found:
        with open(path) as f:
            r = json.load(f)
        recorded = r["overrides"]
        root = os.path.dirname(os.path.dirname(recorded["data.vocab_path"]))
        now = presets.run_overrides(
            "small", r["row"], r["seed"], root, data_dir=recorded["data.dir"]
        )
        added = [k for k in now if k not in recorded]  # train.keep_checkpoint_period
        assert set(added) <= set(CADENCE_KEYS), (path, added)
        assert [k for k in now if k in recorded] == list(recorded), path
        assert runner._substance(now) == runner._substance(recorded), path
        changed = {k for k in recorded if now[k] != recorded[k]}
        assert changed <= set(CADENCE_KEYS), (path, changed)


def test_budget_seed_and_vocabulary_per_run():
    # --steps is base's budget: every row the same, big 3x
    assert presets.preset_overrides("small", "A1", None, steps=2000)["train.num_steps"] == 2000
    assert presets.preset_overrides("small", "big", None, steps=2000)["train.num_steps"] == 6000
    a = presets.run_overrides("small", "A1", 1, "/r")
    b = presets.run_overrides("small", "base", 0, "/r", eval_every=25)
    assert a["train.seed"] == 1 and b["train.seed"] == 0
    # one vocabulary for every row and seed: the same batches for a given seed
    assert a["data.vocab_path"] == b["data.vocab_path"] == "/r/vocab/spm_8000.model"
    assert a["train.eval_every_steps"] == 120 and b["train.eval_every_steps"] == 25
    assert runner.workdir_of("/r", "A1", 1) == "/r/A1/seed1"
    assert runner.workdir_of("/r", "A1", 1, "f50") == "/r/variants/f50/A1/seed1"
    # every dev evaluation is a checkpoint, all kept until the run is evaluated at its best; and
    # one each 10 minutes between them (the newest 2 kept): a lost machine costs <= 10 minutes
    assert a["train.checkpoint_every_steps"] == a["train.keep_checkpoint_period"] == 120
    assert a["train.checkpoint_every_secs"] == 600.0 and a["train.keep_checkpoints"] == 2
    # a variant: its own overrides and budget, the main sweep's vocabulary
    f50 = presets.run_overrides("small", "D0.2", 0, "/r", variant="f50")
    s2400 = presets.run_overrides("small", "C8", 1, "/r", variant="s2400")
    assert f50["data.train_split"] == "train[:50%]" and f50["train.num_steps"] == 1200
    assert s2400["train.num_steps"] == 2400 and s2400["train.eval_every_steps"] == 120
    # big keeps its 3x there, and evaluates as often as in its main run (its curve continues)
    big = presets.run_overrides("small", "big", 0, "/r", variant="s2400")
    assert big["train.num_steps"] == 7200 and big["train.eval_every_steps"] == 360
    assert presets.run_overrides("small", "big", 0, "/r")["train.eval_every_steps"] == 360
    assert f50["data.vocab_path"] == s2400["data.vocab_path"] == a["data.vocab_path"]
    # results are compared as the files they name on any machine: the vocabulary by its place
    # under the root, the data by its place beside the checkout
    here = dict(a, **{"data.dir": os.path.join(REPO, "..", "shared", "data", "multi30k")})
    there = dict(here, **{"data.vocab_path": "/elsewhere/runs/x/vocab/spm_8000.model"})
    assert runner._substance(here) == runner._substance(there)
    assert runner._substance(here)["data.dir"] == "<shared>/data/multi30k"
    # ... and a result recorded in another machine's checkout (its own ../shared) is the same run
    elsewhere = dict(there, **{"data.dir": "/home/u/tfm_jax/../shared/data/multi30k"})
    assert runner._substance(elsewhere) == runner._substance(here)
    other_data = dict(here, **{"data.dir": "/home/u/shared/data/wmt14"})
    assert runner._substance(other_data) != runner._substance(here)
    assert sweep.parse_seeds("0,1,2") == [0, 1, 2]
    with pytest.raises(SystemExit):
        sweep.parse_seeds("0,0")


@pytest.mark.slow
def test_micro_sweep_seeds_resume_and_budget(tmp_path, capsys):
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16)
    runs, out = tmp_path / "runs", tmp_path / "out"
    common = ["--preset=micro", "--rows=D0.0,base", f"--root={runs}", f"--out={out}",
              f"--data_dir={corpus}"]  # fmt: skip
    assert sweep.main([*common, "--seeds=0"]) == 0
    with open(out / "table3_micro.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["row"] for r in rows] == ["base", "D0.0"]  # base first, then Table 3's order
    for r in rows:
        paper = TABLE3[r["row"]]
        assert float(r["paper PPL"]) == paper.ppl and float(r["paper BLEU"]) == paper.bleu
        assert float(r["PPL (dev)"]) > 1.0 and r["seeds"] == "0" and r["PPL sd"] == ""
    assert rows[0]["paper params (M)"] == "65" and rows[1]["P_drop"] == "0.0"
    result = json.loads((runs / "D0.0" / "seed0" / "result.json").read_text())
    assert result["seed"] == 0 and result["overrides"]["train.seed"] == 0
    assert [s for s, _ in result["dev_curve"]] == [5]  # micro evaluates at the end only
    assert os.path.exists(result["overrides"]["data.vocab_path"])  # shared, under the root
    # its size, from the evaluated weights, is what `params` counts for its config
    config = os.path.join(REPO, "configs", "table3.py") + ":D0.0"
    capsys.readouterr()
    overrides = presets.cli_args(result["overrides"])
    assert cli_main(["params", f"--config={config}", "--json", *overrides]) == 0
    counted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]["D0.0"]
    assert result["params"] == counted["params"] > 0
    # the machine that trained it, from the train log's header: the sweep mixes machines
    assert result["platform"] == f"cpu ({hostenv.cpu_model() or 'unknown processor'})"
    md = (out / "table3_micro.md").read_text()
    assert "## Protocol" in md and "- Seeds: 0 for every row." in md
    assert "Scale: a few steps" in md and "| base |" in md and "paper BLEU" in md
    # one seed: no noise estimate, so D0.0 is inconclusive; the other 13 were not run
    assert "0 of 14 comparisons reproduced or tied as in the paper" in md
    assert "1 inconclusive (within noise), 13 not run" in md
    assert "| 9 | D0.0 vs base | worse (+17.3%) |" in md
    assert f"Machines, 2 runs: 2 on {result['platform']}." in md

    # rerun with a second seed: the seed-0 runs are read back, not retrained
    stamps = {r: os.path.getmtime(runs / r / "seed0" / "result.json") for r in ("base", "D0.0")}
    (runs / "base" / "result.json").write_text("{}")  # the old single-seed layout
    assert sweep.main([*common, "--seeds=0,1"]) == 0
    assert "not read (the old single-seed layout" in capsys.readouterr().out
    for r, t in stamps.items():
        assert os.path.getmtime(runs / r / "seed0" / "result.json") == t
        assert (runs / r / "seed1" / "result.json").exists()
    with open(out / "table3_micro_seeds.csv") as f:
        seeds = [(r["row"], r["seed"]) for r in csv.DictReader(f)]
    assert seeds == [("base", "0"), ("base", "1"), ("D0.0", "0"), ("D0.0", "1")]
    md = (out / "table3_micro.md").read_text()
    assert "- Seeds: 0, 1 for every row." in md and "n=2 |" in md
    assert "comparisons reproduced or tied as in the paper" in md
    assert (out / "table3_micro.png").exists()

    # --report_only writes the table from the finished runs and trains nothing: a row with no
    # finished run is "not run", and a seed with no result is left out
    report = tmp_path / "report"
    assert sweep.main([*common, "--seeds=0,1,2", "--rows=base,D0.0,A1", f"--out={report}",
                   "--report_only"]) == 0  # fmt: skip
    assert not (runs / "A1").exists() and not (runs / "base" / "seed2").exists()
    with open(report / "table3_micro_seeds.csv") as f:
        assert [(r["row"], r["seed"]) for r in csv.DictReader(f)] == seeds
    md = (report / "table3_micro.md").read_text()
    assert "13 not run" in md and "n=2 |" in md

    # --parallel: after the first run (alone: it trains the vocabulary), runs go side by side in
    # their own processes, each told its share of an accelerator's memory; the numbers are the
    # sequential run's
    assert commands.parallel_env(1) == {} and commands.parallel_env(4) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.225"
    }
    par = tmp_path / "par"
    assert sweep.main([*common, "--seeds=0", "--rows=base,D0.0,A1", f"--root={par}",
                   f"--out={par / 'out'}", "--parallel=2"]) == 0  # fmt: skip
    for r in ("base", "D0.0"):
        ours = json.loads((par / r / "seed0" / "result.json").read_text())
        theirs = json.loads((runs / r / "seed0" / "result.json").read_text())
        assert ours["dev_curve"] == theirs["dev_curve"] and ours["bleu"] == theirs["bleu"]
    with open(par / "out" / "table3_micro_seeds.csv") as f:
        assert [r["row"] for r in csv.DictReader(f)] == ["base", "A1", "D0.0"]  # Table 3 order

    # another budget in the same root is refused, not mixed in
    with pytest.raises(SystemExit, match="train.num_steps"):
        sweep.main([*common, "--seeds=0", "--steps=6"])

    # a mirror named after the run finished (A1 was trained under `par`, mirrored elsewhere):
    # the sweep copies the finished result there and trains nothing
    mirror = tmp_path / "mirror"
    done = par / "A1" / "seed0" / "result.json"
    stamp = os.path.getmtime(done)
    assert sweep.main([*common, "--seeds=0", "--rows=A1", f"--root={par}", f"--out={par / 'out'}",
                       f"--mirror={mirror}"]) == 0  # fmt: skip
    assert os.path.getmtime(done) == stamp
    mirrored = json.loads((mirror / "A1" / "seed0" / "result.json").read_text())
    assert mirrored == json.loads(done.read_text())
    assert mirrored["bleu_at"] == "best" and mirrored["best_step"] == 5  # one eval: the end
    # a new machine: the runs' workdirs are gone, their results are in the committed mirror, and
    # the sweep skips every finished run (nothing is trained: no workdir is made)
    fresh = tmp_path / "fresh"
    capsys.readouterr()
    assert sweep.main([*common, "--seeds=0", "--rows=A1", f"--root={fresh}",
                       f"--mirror={mirror}"]) == 0  # fmt: skip
    assert "A1 seed 0: ppl" in capsys.readouterr().out
    assert not list(fresh.rglob("metrics.jsonl"))  # nothing trained
    # ... and its vocabulary is the mirror's file, the pieces the runs used (not retrained),
    # whose digest each result records; a root with other pieces is refused
    (vocab,) = (par / "vocab").glob("spm_*.model")
    digest = hashlib.sha256(vocab.read_bytes()).hexdigest()[:16]
    assert mirrored["vocab_sha256"] == digest
    assert (mirror / "vocab" / vocab.name).read_bytes() == vocab.read_bytes()
    assert (fresh / "vocab" / vocab.name).read_bytes() == vocab.read_bytes()
    other = tmp_path / "other"
    (other / "vocab").mkdir(parents=True)
    (other / "vocab" / vocab.name).write_bytes(b"other pieces")
    with pytest.raises(SystemExit, match=f"trained with the vocabulary of sha256 {digest}"):
        sweep.main([*common, "--seeds=0", "--rows=A1", f"--root={other}", f"--mirror={mirror}"])
    # ... and so does the data: a result is matched to the files it was trained on, not just
    # to a path of the same shape
    assert mirrored["data_sha256"] == runner.data_digest(str(corpus)) is not None
    with open(corpus / "train.en", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    recorded = mirrored["data_sha256"]
    with pytest.raises(SystemExit, match=f"trained with the data of sha256 {recorded}"):
        sweep.main([*common, "--seeds=0", "--rows=A1", f"--root={fresh}", f"--mirror={mirror}"])

    assert sweep.main([f"--find_budget={runs / 'base' / 'seed0'}"]) == 0
    budget = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert budget["evals"] == 1 and budget["plateau_step"] is None  # one point: no plateau


# A stand-in for `python -m tfm_jax`: records each call's environment, then is killed like the
# kernel's out-of-memory killer kills (SIGKILL) while the malloc heap tunables are on (or always).
FAKE_TFM = """
import os, signal, sys
env = os.environ
with open(sys.argv[-1], "a") as f:
    f.write(env.get("TFM_JAX_MALLOC_TUNABLES", "1") + "|" + env.get("GLIBC_TUNABLES", "") + "\\n")
if sys.argv[-2] == "exit3":
    sys.exit(3)
if sys.argv[-2] == "always" or "glibc.malloc.mmap_max=0" in env.get("GLIBC_TUNABLES", ""):
    os.kill(os.getpid(), signal.SIGKILL)
print("finished")
"""


def fake_run(tmp_path, mode, env, name=None):
    calls, log = tmp_path / f"calls_{name or mode}", tmp_path / f"log_{name or mode}.txt"
    fake = [sys.executable, "-c", FAKE_TFM]
    try:
        out = commands.run_cmd(["train", mode, str(calls)], str(log), env, program=fake)
        return out, calls, log
    finally:
        assert calls.exists()


def test_a_run_killed_with_the_malloc_heap_tunables_runs_again_with_huge_pages_only(
    tmp_path, capsys
):
    from tfm_jax.platform import host

    ours = ":".join(host.TUNABLES)
    with_tunables = {"GLIBC_TUNABLES": ours, "TFM_JAX_MALLOC_TUNABLES": "1"}
    out, calls, log = fake_run(tmp_path, "oom", with_tunables)
    assert out == "finished"
    # the second without the heap's tunables: huge pages only (1.43x no tunables on A32)
    assert calls.read_text().splitlines() == [f"1|{ours}", f"hugepages|{host.HUGE_PAGES}"]
    assert "was killed (SIGKILL)" in capsys.readouterr().out
    assert "running it again with TFM_JAX_MALLOC_TUNABLES=hugepages" in log.read_text()

    with pytest.raises(RuntimeError) as e:
        fake_run(tmp_path, "always", with_tunables)
    assert "was killed by SIGKILL" in str(e.value) and "out-of-memory killer" in str(e.value)
    assert "needs a host with more memory" in str(e.value)
    assert len((tmp_path / "calls_always").read_text().splitlines()) == 2  # retried once only

    with pytest.raises(RuntimeError, match=r"failed \(exit status 3\); see .*log_exit3.txt"):
        fake_run(tmp_path, "exit3", with_tunables)
    assert len((tmp_path / "calls_exit3").read_text().splitlines()) == 1  # not a kill: no retry

    # Started without them (the user's opt-out): nothing to retry, and the message says why.
    opted_out = {"TFM_JAX_MALLOC_TUNABLES": "0", "GLIBC_TUNABLES": ""}
    with pytest.raises(RuntimeError, match="needs a host with more memory"):
        fake_run(tmp_path, "always", opted_out, name="opted_out")
    assert len((tmp_path / "calls_opted_out").read_text().splitlines()) == 1


def test_a_runs_output_reaches_its_log_while_it_runs(tmp_path):
    # A sweep killed mid-run (a GPU lease ending, a timeout) must still leave the progress lines.
    import threading
    import time

    marker, log = tmp_path / "go_on", tmp_path / "log.txt"
    child = (
        "import os, sys, time\n"
        "print('step 50/1200 loss 7.0')\n"
        "t = time.time()\n"
        "while not os.path.exists(sys.argv[-1]) and time.time() - t < 60: time.sleep(0.05)\n"
        "print('{\"ppl\": 6.9}')\n"
    )
    out = {}
    thread = threading.Thread(
        target=lambda: out.update(
            last=commands.run_cmd(
                ["train", str(marker)], str(log), program=[sys.executable, "-c", child]
            )
        )
    )
    thread.start()
    deadline = time.time() + 30
    while not (log.exists() and "step 50/1200" in log.read_text()):
        assert time.time() < deadline, "the progress line is not in the log while the run runs"
        time.sleep(0.05)
    assert thread.is_alive()  # still running: the line came before the end
    marker.touch()
    thread.join(60)
    assert out["last"] == '{"ppl": 6.9}'
    assert log.read_text().endswith('step 50/1200 loss 7.0\n{"ppl": 6.9}\n')


def test_readme_states_the_committed_reports_result():
    """The README's Table 3 section says what experiments/results/table3_small.md says: its
    summary line, and one item for each comparison that did not come out as the paper's."""
    import re

    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(REPO, "experiments", "results", "table3_small.md")) as f:
        report = f.read()
    summary = re.search(r"\*\*(\d+ of 14 comparisons reproduced or tied as in the paper)", report)
    section = readme.split("### Result so far (preset `small`")[1].split("\n## ")[0]
    assert f"**{summary.group(1)}**" in section
    listed = report.split("Comparisons not reproduced or tied, and what tests them:")[1]
    rows = re.findall(r"^- (\S+): ", listed, re.M)
    assert rows and all(f"- {row} vs " in section for row in rows), rows
    # ... and each of them says the outcome of every explanation experiment that has one
    for row, tests in re.findall(r"^- (\S+): (.*)$", listed, re.M):
        item = section.split(f"- {row} vs ")[1].split("\n- ")[0]
        for name, outcome in re.findall(r"(\S+) \((supported|refuted|inconclusive)\)", tests):
            assert f"`{name}` **{outcome}**" in item, (row, name, outcome)
    assert "table3_small.png" in section and "table3_small.md" in section


def test_mirror_none_turns_the_mirror_off(monkeypatch, tmp_path):
    """--mirror=none is a word, not a folder: no mirror (it was once resolved into a path)."""
    seen = {}
    monkeypatch.setattr(sweep, "sweep", lambda args, *a: seen.setdefault("mirror", args.mirror))
    common = ["--preset=small", "--rows=base", "--seeds=0", f"--root={tmp_path / 'r'}"]
    sweep.main([*common, "--mirror=none"])
    assert seen.pop("mirror") is None
    sweep.main(common)  # the default: the committed folder named after the root
    assert seen.pop("mirror") == os.path.join(REPO, "experiments", "results", "r_runs")


def _device_script(tmp_path, name, **env):
    """experiments/table3_device.sh in its CPU mode (the micro preset) into tmp_path/name."""
    work = tmp_path / name
    env = process_env(PYTHON=sys.executable, TABLE3_DEVICE_MODE="cpu", TABLE3_DEVICE_WORK=str(work),
                      TABLE3_DEVICE_PARALLEL="2,2", **env)  # fmt: skip
    proc = subprocess.run(
        ["bash", os.path.join(REPO, "experiments", "table3_device.sh")], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    with tarfile.open(work / "results.tgz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    return proc, work, names


@pytest.mark.multiprocess
@pytest.mark.slow
def test_device_script_trains_what_is_missing_and_brings_back_what_finished(tmp_path):
    corpus = str(write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16))
    # both sweeps side by side: the rows' (base, A1 seed 0) and the explanations' (E: E-std1)
    proc, work, names = _device_script(tmp_path, "first", TABLE3_DEVICE_DATA=corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert names == ["./A1/seed0/result.json", "./E-std1/seed0/result.json",
                     "./E-std1/seed1/result.json", "./base/seed0/result.json"]  # fmt: skip
    log = (work / "log.txt").read_text()
    for run in ("base seed 0", "A1 seed 0", "E-std1 seed 0", "E-std1 seed 1"):
        assert log.count(f"] {run}: ppl ") == 1, log  # each finished run's line, once
    assert "finished 4 run(s)" in log
    result = json.loads((work / "mirror" / "A1" / "seed0" / "result.json").read_text())
    assert result["platform"].startswith("cpu (")

    # another machine with that mirror (the committed results): nothing is trained again
    proc, again, names = _device_script(
        tmp_path, "again", TABLE3_DEVICE_DATA=corpus, TABLE3_DEVICE_MIRROR=str(work / "mirror")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert names == [] and not list((again / "root").rglob("metrics.jsonl"))

    # the budget stops both sweeps and every run under them; what finished still comes back
    proc, cut, names = _device_script(
        tmp_path, "cut", TABLE3_DEVICE_DATA=corpus, TABLE3_DEVICE_BUDGET_S="25"
    )
    assert proc.returncode == 1
    assert "budget: stopping the sweeps" in (cut / "log.txt").read_text()
    assert names == []  # nothing finishes in 5 s
    left = subprocess.run(["pgrep", "-f", str(cut / "root")], capture_output=True, text=True)
    assert left.stdout == "", left.stdout  # no run goes on training


@pytest.mark.slow
def test_a_longer_budget_continues_the_main_run_as_if_trained_from_scratch(tmp_path, monkeypatch):
    """A variant that only lengthens the budget (s2400) starts from its main run's final
    checkpoint, with the main run's dev curve, and ends where the same run from step 0 ends:
    the schedule does not depend on train.num_steps and a resume is bitwise exact."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16)
    monkeypatch.setitem(
        presets.VARIANTS, "s10", presets.Variant({}, steps=10, eval_every=5, continues=True)
    )
    root = tmp_path / "runs"
    kw = dict(preset="micro", row="base", seed=0, root=str(root), data_dir=str(corpus))
    main = runner.run_one(**kw)
    assert [s for s, _ in main["dev_curve"]] == [5]
    continued = runner.run_one(**kw, variant="s10")
    assert continued["continued_from"] == {"run": str(root / "base" / "seed0"), "step": 5}
    assert continued["dev_curve"][0] == main["dev_curve"][0]
    log = (root / "variants" / "s10" / "base" / "seed0" / "log.txt").read_text()
    assert "Resumed from step 5 in" in log  # it trained steps 6..10 only

    # the same variant again, its main run's checkpoints gone: it trains from step 0
    (root / "variants").rename(tmp_path / "continued")
    for ckpt in (root / "base" / "seed0" / "checkpoints").iterdir():
        shutil.rmtree(ckpt)
    scratch = runner.run_one(**kw, variant="s10")
    assert "continued_from" not in scratch
    assert [s for s, _ in scratch["dev_curve"]] == [5, 10]
    assert scratch["dev_curve"] == continued["dev_curve"]
    assert scratch["bleu"] == continued["bleu"] and scratch["ppl"] == continued["ppl"]
