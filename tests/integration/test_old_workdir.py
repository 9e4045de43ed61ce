"""A workdir written before the package layout (tests/data/workdir_v0, made at commit b348338)
still restores, translates, evaluates and resumes, with the outputs it gave then, from another
folder than the one it was trained in: its saved configs pin its vocabulary under a workdir that
no longer exists, as for a workdir copied to another machine."""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import REPO
from helpers.runs import write_tiny_corpus

from tfm_jax.cli.main import main

FIXTURE = os.path.join(REPO, "tests", "data", "workdir_v0")
OLD_WORKDIR = "/tmp/oldwd"  # where the fixture was trained: its configs' paths say so
GOLDEN = json.load(open(FIXTURE + ".golden.json", encoding="utf-8"))


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("old")
    corpus = write_tiny_corpus(root / "corpus", **GOLDEN["corpus"])
    workdir = root / "workdir"
    shutil.copytree(FIXTURE, workdir)
    moved_from(workdir, str(root / "gone"))
    return corpus, workdir


def moved_from(workdir, gone: str) -> None:
    """Make the configs saved in `workdir` say it was trained in `gone` (a folder that does not
    exist), whatever this machine holds at the fixture's recorded /tmp/oldwd."""
    for folder, _, files in os.walk(workdir):
        for name in files:
            if name in ("config.json", "metadata"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text.replace(OLD_WORKDIR, gone))


@pytest.mark.parametrize("which", ["averaged", "latest"])
@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_old_checkpoints_translate_as_they_did(old_run, tmp_path, which, search):
    corpus, workdir = old_run
    src = tmp_path / "in.en"
    with open(corpus / "val.en", encoding="utf-8") as f:
        src.write_text("".join(f.readline() for _ in range(4)))
    out = tmp_path / "out.de"
    argv = [
        "translate",
        f"--workdir={workdir}",
        f"--checkpoint={which}",
        "--cpu_devices=1",
        f"--input={src}",
        f"--output={out}",
    ] + (["--greedy"] if search == "greedy" else [])
    assert main(argv) == 0
    assert out.read_text().splitlines() == GOLDEN["translations"][f"{search}/{which}"]


def test_old_run_evaluates_to_the_same_scores(old_run, tmp_path):
    corpus, workdir = old_run
    argv = [
        "evaluate",
        f"--workdir={workdir}",
        "--split=val",
        "--cpu_devices=1",
        f"--config.data.dir={corpus}",
        f"--out={tmp_path}",
    ]
    assert main(argv) == 0
    scores = json.loads((tmp_path / "scores.json").read_text())
    want = GOLDEN["evaluate_val_averaged"]
    assert scores["num_sentences"] == want["num_sentences"]
    assert scores["bleu"] == pytest.approx(want["bleu"], abs=1e-9)
    assert scores["chrf"] == pytest.approx(want["chrf"], abs=1e-9)
    np.testing.assert_allclose([scores["nll"], scores["ppl"]], [want["nll"], want["ppl"]],
                               rtol=1e-5)  # fmt: skip


def test_old_run_resumes_where_it_stopped(old_run):
    corpus, workdir = old_run
    argv = [
        "train",
        "--config=configs/small.py",
        f"--workdir={workdir}",
        f"--config.data.dir={corpus}",
        "--config.train.num_steps=124",
        *GOLDEN["train_args"],
        # configs/small.py's settings when the run was made (b348338); the file has moved on
        "--config.model.dropout=0.1",
        "--config.model.dtype=float32",
    ]
    cwd = os.getcwd()
    os.chdir(REPO)  # configs/ is relative
    try:
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    train = {r["step"]: r["loss"] for r in records if r["kind"] == "train" and r["step"] > 120}
    want = GOLDEN["resume_to_124"]
    assert sorted(train) == [122, 124]  # continued from step 120, not from scratch
    np.testing.assert_allclose([train[122], train[124]], [want["train"]["122"],
                               want["train"]["124"]], rtol=1e-6)  # fmt: skip
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[-1]["step"] == 124
    np.testing.assert_allclose(evals[-1]["loss"], want["eval_loss_124"], rtol=1e-5)


def test_a_moved_workdir_without_its_vocabulary_is_a_clear_error(old_run, tmp_path, capsys):
    corpus, _ = old_run
    copy = tmp_path / "copy"  # the fixture as it was trained, moved without its vocab/
    shutil.copytree(FIXTURE, copy, ignore=shutil.ignore_patterns("vocab"))
    moved_from(copy, str(tmp_path / "gone"))
    src = tmp_path / "in.en"
    src.write_text("a b c\n")
    assert main(["translate", f"--workdir={copy}", "--cpu_devices=1", f"--input={src}"]) != 0
    err = capsys.readouterr().err
    assert "spm_128_b41380a23df9.model' does not exist (the run was trained in" in err
    assert "pass --config.data.vocab_path=<the run's sentencepiece .model>" in err
    # resuming never trains another vocabulary (it would not match the checkpoints' embeddings)
    argv = ["train", "--config=configs/small.py", f"--workdir={copy}",
            f"--config.data.dir={corpus}", "--config.train.num_steps=124", *GOLDEN["train_args"],
            "--config.model.dropout=0.1", "--config.model.dtype=float32"]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert main(argv) != 0
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert f"cannot resume {copy}: its vocabulary data.vocab_path=" in err
    assert "Copy that .model file back, or resume with --config.data.vocab_path=" in err
    assert not (copy / "vocab").exists() and not os.path.exists(tmp_path / "gone")
