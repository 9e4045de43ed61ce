"""`--machine_check` end to end: a finished run trained again by its own settings to one
evaluation past its best. On the machine that made it the check is the run itself, bit for bit
(0.0% at every evaluation): what tells another machine's difference from the check's own."""

import json

import pytest
from helpers.runs import write_tiny_corpus

from experiments.table3 import machines, sweep


@pytest.mark.slow
def test_a_machine_check_on_the_same_machine_is_the_run_and_lands_in_the_report(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=600, n_val=16)
    root, mirror, out = tmp_path / "runs", tmp_path / "mirror", tmp_path / "out"
    common = ["--preset=micro", "--rows=base", "--seeds=0", f"--root={root}", f"--out={out}",
              f"--data_dir={corpus}", "--steps=6", "--eval_every=2",
              f"--mirror={mirror}"]  # fmt: skip
    assert sweep.main(common) == 0
    result = json.loads((root / "base" / "seed0" / "result.json").read_text())
    best = min(result["dev_curve"], key=lambda p: p[1])[0]

    assert sweep.main([*common, "--machine_check=base"]) == 0
    where = root / machines.CHECKS / "main" / "base" / "seed0"
    check = json.loads((where / "check.json").read_text())
    assert check == json.loads((mirror / machines.CHECKS / "main" / "base" / "seed0" /
                                "check.json").read_text())  # fmt: skip
    assert check["steps"] == min(best + 2, 6)
    assert check["platform"] == check["recorded_platform"] == result["platform"]
    assert [p["step"] for p in check["points"]] == [
        s for s, _ in result["dev_curve"] if s <= check["steps"]
    ]
    assert all(p["relative"] == 0.0 for p in check["points"])  # the run, bit for bit
    assert check["best_relative"] == 0.0
    assert f"--config.train.num_steps={check['steps']}" in check["command"]
    report = (out / "table3_micro.md").read_text()
    assert "Machine checks" in report and "- base seed 0, recorded on" in report

    assert "--machine_check" not in report  # its command is the sweep's, which trains the runs

    # recorded: a second call (the flag's value as its own word) trains nothing
    mtime = (where / "metrics.jsonl").stat().st_mtime_ns
    assert sweep.main([*common, "--machine_check", "base"]) == 0
    assert (where / "metrics.jsonl").stat().st_mtime_ns == mtime
    report = (out / "table3_micro.md").read_text()
    assert "--machine_check" not in report and "--mirror" in report
    assert "base" not in report.split("Command: `")[1].split("`")[0].split()  # nor its value
