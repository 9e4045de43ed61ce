"""`--bleu_at_best`: a run made before the best checkpoint was kept gets its best checkpoint's
BLEU by a replay to that step, taken only where the replay's dev curve is the run's."""

import json
import shutil

import pytest
from helpers.runs import write_tiny_corpus

from experiments.table3 import replay, runner, sweep


def _as_before_the_best_was_kept(path, worse_last_by=1.0, off_by=0.0):
    """A finished run's result.json as the first sweep wrote it: BLEU at the latest, no record of
    where; its last evaluation made worse so that its best is an earlier one (and that best's
    recorded NLL moved by `off_by`, as a run on another machine would have it)."""
    r = json.loads(path.read_text())
    for key in ("bleu_at", "bleu_latest", "ppl_best_evaluated", "best_step"):
        r.pop(key, None)
    curve = [list(p) for p in r["dev_curve"]]
    curve[-1][1] = curve[0][1] + worse_last_by
    curve[0][1] += off_by
    r["dev_curve"] = curve
    path.write_text(json.dumps(r))
    return r


def _micro_sweep(tmp_path, eval_every):
    """One micro base run of 6 steps, evaluated every `eval_every`, in a root with a mirror: the
    run the replays are made of. Returns the corpus, the root, the mirror and the sweep's flags."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16)
    root, mirror = tmp_path / "runs", tmp_path / "mirror"
    common = ["--preset=micro", "--rows=base", "--seeds=0", f"--root={root}",
              f"--out={tmp_path / 'out'}", f"--data_dir={corpus}", "--steps=6",
              f"--eval_every={eval_every}", f"--mirror={mirror}"]  # fmt: skip
    assert sweep.main(common) == 0
    return corpus, root, mirror, common


@pytest.mark.slow
def test_a_replay_gives_the_best_checkpoints_bleu_only_when_it_is_the_run(tmp_path, capsys):
    corpus, root, mirror, common = _micro_sweep(tmp_path, eval_every=3)
    result_path = root / "base" / "seed0" / "result.json"
    copy_path = mirror / "base" / "seed0" / "result.json"
    assert [s for s, _ in json.loads(result_path.read_text())["dev_curve"]] == [3, 6]
    # the same run trained to step 3 only, in a root of its own with the same vocabulary: what
    # the best's BLEU must be
    shutil.copytree(root / "vocab", tmp_path / "short" / "vocab")
    short = runner.run_one("micro", "base", 0, str(tmp_path / "short"), data_dir=str(corpus),
                           steps=3, eval_every=3)  # fmt: skip

    old = _as_before_the_best_was_kept(result_path)
    copy_path.write_text(result_path.read_text())
    assert replay.best_to_replay(old) == 3
    assert sweep.main([*common, "--bleu_at_best"]) == 0
    for path in (result_path, copy_path):  # the root's and the mirror's alike
        r = json.loads(path.read_text())
        assert r["bleu_at"] == "best" and r["best_step"] == 3
        assert r["bleu"] == short["bleu"] and r["ppl_best_evaluated"] == short["ppl"]
        assert r["ppl_best_evaluated"] != r["ppl"]  # step 3's checkpoint, not the latest (6)
        assert r["bleu_latest"] == old["bleu"]
        assert r["replayed"]["max_relative_ppl_difference"] <= replay.TOLERANCE
        assert r["dev_curve"] == old["dev_curve"]  # the recorded curve is left as it was
    assert replay.best_to_replay(r) is None  # done: a second --bleu_at_best trains nothing

    # a run the replay does not reproduce (its recorded best 1e-3 nats off) keeps its BLEU
    old = _as_before_the_best_was_kept(result_path, off_by=1e-3)
    copy_path.write_text(result_path.read_text())
    capsys.readouterr()
    assert sweep.main([*common, "--bleu_at_best"]) == 0
    assert "base seed 0: the replay to step 3 is not the run" in capsys.readouterr().out
    refused = json.loads(result_path.read_text())
    assert refused == json.loads(copy_path.read_text())  # the root's and the mirror's alike
    assert refused.pop("replay_refused")["max_relative_ppl_difference"] > replay.TOLERANCE
    assert refused == old  # its BLEU and everything else as they were
    # this kind of machine does not try again (nothing trains: the log is as it was)
    log = root / "replays" / "base" / "seed0" / "log.txt"
    size = log.stat().st_size
    assert sweep.main([*common, "--bleu_at_best"]) == 0
    assert "its replay on this kind of machine" in capsys.readouterr().out
    assert log.stat().st_size == size
    # and its report marks that BLEU as the latest's
    report = (tmp_path / "out" / "table3_micro.md").read_text()
    assert "†" in report and "Replayed to their best step and not the run" in report
    # a run recorded on another processor is not replayed (nothing trains: the log is as it was)
    result_path.write_text(json.dumps(dict(old, platform="cpu (Other CPU, bf16)")))
    assert sweep.main([*common, "--bleu_at_best"]) == 0
    assert "trained on cpu (Other CPU, bf16), and this machine is" in capsys.readouterr().out
    assert log.stat().st_size == size


@pytest.mark.slow
def test_a_replay_that_is_not_the_run_stops_at_its_first_evaluation(tmp_path, capsys):
    """The replay trains to the run's first evaluation, compares, and only then on to the best
    step: one that differs there (another machine's arithmetic) costs that evaluation's steps,
    not the whole way to the best (D0.0 seed 1 differed by 1.8% at step 120 of its 480)."""
    corpus, root, mirror, common = _micro_sweep(tmp_path, eval_every=2)
    result_path = root / "base" / "seed0" / "result.json"
    replayed = root / "replays" / "base" / "seed0"

    def evaluated():
        lines = (replayed / "metrics.jsonl").read_text().splitlines()
        return [r["step"] for r in map(json.loads, lines) if r["kind"] == "eval"]

    old = _as_before_the_best_was_kept(result_path, off_by=1e-3)
    assert [s for s, _ in old["dev_curve"]] == [2, 4, 6] and replay.best_to_replay(old) == 4
    capsys.readouterr()
    assert sweep.main([*common, "--bleu_at_best"]) == 0
    assert "base seed 0: the replay to step 2 is not the run" in capsys.readouterr().out
    assert evaluated() == [2]  # stopped there, not trained on to step 4
    assert json.loads(result_path.read_text())["replay_refused"]["step"] == 2

    old = _as_before_the_best_was_kept(result_path, off_by=-1e-3)  # the recorded value again
    result_path.write_text(json.dumps({k: v for k, v in old.items() if k != "replay_refused"}))
    assert sweep.main([*common, "--bleu_at_best"]) == 0  # resumes the replay from step 2
    r = json.loads(result_path.read_text())
    assert r["bleu_at"] == "best" and r["best_step"] == 4 and evaluated() == [2, 4]
    assert r["replayed"]["max_relative_ppl_difference"] <= replay.TOLERANCE


def test_curve_difference_reads_every_evaluation_up_to_the_best():
    recorded = [(120, 2.0), (240, 1.9), (360, 2.1)]
    assert replay.curve_difference(recorded, [(120, 2.0), (240, 1.9)], 240) == 0.0
    assert replay.curve_difference(recorded, [(240, 1.9)], 240) is None  # 120 missing
    off = replay.curve_difference(recorded, [(120, 2.0 + 1e-4), (240, 1.9)], 240)
    assert off == pytest.approx(1e-4, rel=1e-3)
    assert replay.best_to_replay({"dev_curve": recorded}) == 240
    assert replay.best_to_replay({"dev_curve": recorded, "bleu_at": "best"}) is None
    assert replay.best_to_replay({"dev_curve": [(120, 2.0), (240, 1.9)]}) is None  # best=latest
