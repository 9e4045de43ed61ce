"""The README's first commands, executed: its main job runs as written (only the workdir and a
tiny step budget changed) from the checkout's root with relative paths, and its test command is
what CI runs."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, process_env
from helpers.runs import cli_args, tiny_run_overrides, write_tiny_corpus

README_WORKDIR = "runs/small"  # the workdir the README's main job names


def first_commands():
    """The ```bash blocks under the README's "## First commands", in order."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## First commands\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, 'README.md has no "## First commands" section'
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    assert len(blocks) >= 2, "the First commands need a main-job and a test-command bash block"
    return [b.replace("\\\n", " ").strip() for b in blocks]


def main_job():
    """The main job's `&&`-separated commands."""
    return [part.strip() for part in first_commands()[0].split("&&")]


def quickstart_command():
    commands = [c for c in main_job() if c.startswith("bash experiments/quickstart.sh")]
    assert len(commands) == 1, f"the README's main job runs no quickstart.sh: {main_job()}"
    return commands[0]


def test_main_job_installs_the_lock_and_runs_the_quickstart():
    installs = [c for c in main_job() if c.startswith("pip install")]
    assert len(installs) == 1 and "-c constraints.txt" in installs[0], installs
    assert os.path.isfile(os.path.join(REPO, "constraints.txt"))
    main = main_job()
    assert main.index(installs[0]) < main.index(quickstart_command())
    assert shlex.split(quickstart_command())[2:] == [README_WORKDIR]


def test_readme_test_command_is_what_ci_runs():
    test_command = first_commands()[1]
    assert "\n" not in test_command
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci_lines = [line.strip() for line in f]
    assert test_command in ci_lines, f".ci/run does not run the README's {test_command!r}"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_readme_main_job_end_to_end():
    """The quickstart on a tiny config and corpus: train, average, plot, evaluate, BLEU lines."""
    workdir = f"runs/_readme_test_{os.getpid()}"  # relative to the checkout's root, as typed
    corpus = f"{workdir}_corpus"
    made_runs = not os.path.isdir(os.path.join(REPO, "runs"))
    argv = [workdir if a == README_WORKDIR else a for a in shlex.split(quickstart_command())]
    argv += cli_args(tiny_run_overrides(corpus))  # data.dir=<corpus>, data.test_split=val, ...
    env = process_env()
    # The README runs it in the activated venv: `python` is this interpreter.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        write_tiny_corpus(os.path.join(REPO, corpus))
        p = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-4000:])
        lines = p.stdout.splitlines()
        assert any(
            re.match(r"^test BLEU \(sacreBLEU, detokenized\): \d+\.\d\d ", line) for line in lines
        ), p.stdout[-2000:]
        assert any(
            re.match(r"^paper-style tokenized, compound-split BLEU: \d+\.\d\d$", line)
            for line in lines
        ), p.stdout[-2000:]

        root = os.path.join(REPO, workdir)
        for name in ("checkpoints", "averaged"):
            assert os.path.isdir(os.path.join(root, name)), name
        for name in ("learning_curves.png", "test_scores.log", "metrics.jsonl", "config.json"):
            assert os.path.isfile(os.path.join(root, name)), name
        with open(os.path.join(root, "test_scores.log"), encoding="utf-8") as f:
            scores = json.loads(f.read().strip().splitlines()[-1])
        assert scores["checkpoint"] == "averaged"
        averaged = [json.loads(line) for line in lines if line.startswith('{"averaged"')]
        assert [a["steps"] for a in averaged] == [[8, 12]]  # train.average_last=2 of 4, 8, 12

        with open(os.path.join(root, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        train_records = [r for r in records if r["kind"] == "train"]
        assert [r["step"] for r in train_records] == [4, 8, 12]
        for key in ("loss", "nll", "ppl", "lr", "target_tokens_per_s", "padding_efficiency",
                    "flops_per_s", "rss_bytes", "peak_rss_bytes"):  # fmt: skip
            assert key in train_records[-1], key
        assert 0 < train_records[-1]["rss_bytes"] <= train_records[-1]["peak_rss_bytes"]
        assert any(r["kind"] == "eval" for r in records)
        assert os.listdir(os.path.join(root, "tensorboard"))  # TensorBoard event files
        assert any(re.match(r"^step 12/12 loss .* RSS \d+\.\d GB \(peak", ln) for ln in lines)

        with open(os.path.join(root, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        assert cfg["paths"]["typed"]["workdir"] == workdir
        assert os.path.isabs(cfg["paths"]["workdir"])
        assert cfg["paths"]["workdir"] == os.path.abspath(root)
        assert os.path.isabs(cfg["data"]["dir"])
        assert cfg["data"]["dir"] == os.path.abspath(os.path.join(REPO, corpus))
        assert cfg["paths"]["typed"]["data_dir"] == corpus
    finally:
        shutil.rmtree(os.path.join(REPO, workdir), ignore_errors=True)
        shutil.rmtree(os.path.join(REPO, corpus), ignore_errors=True)
        if made_runs:
            try:
                os.rmdir(os.path.join(REPO, "runs"))
            except OSError:
                pass
