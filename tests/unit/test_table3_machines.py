"""Machine checks (experiments/table3/machines.py): a run trained again on another machine, its
dev curve beside the recorded one, and the pairs it puts on one machine. Pure functions over
results; the check's training is tests/integration/test_table3_machine_check.py."""

import json
import math

import pytest

from experiments.table3 import machines as M


def _curve(*ppls, every=120):
    return [[every * (i + 1), math.log(p)] for i, p in enumerate(ppls)]


def test_summarize_compares_the_curves_at_each_evaluation_and_at_each_best():
    s = M.summarize(_curve(20.0, 10.0, 12.0, 15.0), _curve(22.0, 10.5, 10.2), upto=360)
    assert [p["step"] for p in s["points"]] == [120, 240, 360]  # the recorded 480 is past upto
    assert [p["relative"] for p in s["points"]] == pytest.approx([0.1, 0.05, -0.15])
    assert s["best"] == {
        "recorded": {"step": 240, "ppl": pytest.approx(10.0)},
        "here": {"step": 360, "ppl": pytest.approx(10.2)},
    }
    assert s["best_relative"] == pytest.approx(0.02)  # best against best, wherever each is
    assert s["largest_relative"] == pytest.approx(-0.15)  # by size, signed
    assert s["best_at_end"]  # here the curve was still falling at its last evaluation
    same = M.summarize(_curve(20.0, 10.0, 12.0), _curve(20.0, 10.0, 12.0), upto=360)
    assert same["best_relative"] == same["largest_relative"] == 0.0 and not same["best_at_end"]
    with pytest.raises(ValueError, match="no evaluation in common"):
        M.summarize(_curve(20.0), _curve(20.0, every=100), upto=360)


def test_parse_names_a_variant_or_the_main_sweep():
    assert M.parse("f25/base,C8,") == [("f25", "base"), (None, "C8")]


def _check(variant="f25", row="base", seed=0, platform="cpu (B)"):
    c = {"variant": variant, "row": row, "seed": seed, "recorded_platform": "cpu (A)",
         "platform": platform, "steps": 360, "command": "python -m tfm_jax train ..."}  # fmt: skip
    return c | M.summarize(_curve(20.0, 10.0, 12.0), _curve(21.0, 10.5, 11.0), upto=360)


def _result(row, seed=0, variant="f25", platform="cpu (B)", best=9.0):
    return {"row": row, "seed": seed, "variant": variant, "platform": platform,
            "dev_curve": _curve(30.0, best, 12.0)}  # fmt: skip


def test_check_lines_put_the_same_seeds_runs_of_its_machine_against_the_check():
    results = [
        _result("D0.2"),  # same variant, seed and machine: a pair on one machine
        _result("D0.2", seed=1),  # another seed
        _result("Dls0.0", platform="cpu (A)"),  # trained on the recorded run's machine
        _result("D0.2", variant="f50"),  # another variant
        _result("base"),  # the checked row itself
    ]
    lines = M.check_lines([_check()], results)
    assert lines[0].startswith("Machine checks") and lines[-1] == ""
    body = [line for line in lines[1:] if line]
    assert body[0] == (
        "- f25/base seed 0, recorded on cpu (A), trained on cpu (B) to step 360: best dev PPL "
        "10.00 (step 240) there, 10.50 (step 240) here, +5.0%; largest difference at one "
        "evaluation -8.3%."
    )
    # D0.2's best 9.0 against the check's 10.5 here and the recorded 10.0
    assert body[1:] == [
        "  - f25/D0.2 seed 0, trained there too: -14.3% against this base (-10.0% against the "
        "recorded one)."
    ]
    assert M.check_lines([], results) == []
    unnamed = M.check_lines([_check() | {"recorded_platform": None}], [])
    assert "recorded on a machine its result does not name, trained on cpu (B)" in unnamed[2]


def test_read_checks_finds_the_roots_and_the_mirrors_checks_and_a_recorded_one_is_not_rerun(
    tmp_path,
):
    root, mirror = tmp_path / "runs", tmp_path / "mirror"
    for base, check in ((root, _check()), (mirror, _check(platform="cpu (mirror)")),
                        (mirror, _check(variant=None, row="C8", seed=1))):  # fmt: skip
        where = M.check_dir(str(base), check["variant"], check["row"], check["seed"])
        (tmp_path / where).mkdir(parents=True, exist_ok=True)
        (tmp_path / where / "check.json").write_text(json.dumps(check))
    found = M.read_checks(str(root), str(mirror))
    assert [(c["variant"], c["row"], c["seed"]) for c in found] == [
        (None, "C8", 1),
        ("f25", "base", 0),
    ]
    assert found[1]["platform"] == "cpu (B)"  # the root's copy wins
    # recorded: run_check returns it and trains nothing (no finished run here to train from)
    assert M.run_check("small", "C8", 1, str(root), mirror=str(mirror)) == found[0]
    assert M.read_checks(str(tmp_path / "none"), None) == []
