"""Table 3's protocol, statistics, evidence and report (experiments/table3/stats.py,
evidence.py, report.py) on hand-made numbers: golden verdicts, the summary line, the protocol
against the paper's own numbers, the plateau of a dev curve, the readings of a comparison's dev
curves, and the report written from synthetic results (no training)."""

import json
import math

import pytest

from experiments.table3 import evidence as E
from experiments.table3 import explain as X
from experiments.table3 import presets
from experiments.table3 import report as R
from experiments.table3 import rules as V
from experiments.table3 import stats as S
from experiments.table3.presets import TABLE3 as ROWS
from tfm_jax.viz.curves import read_metrics


def test_differences_and_directions():
    assert S.difference("ppl", 11.0, 10.0) == pytest.approx(10.0)  # % of the reference
    assert S.difference("bleu", 24.9, 25.8) == pytest.approx(-0.9)  # points
    assert S.direction("ppl", -1.0) == "better" and S.direction("ppl", 1.0) == "worse"
    assert S.direction("bleu", 1.0) == "better" and S.direction("bleu", -1.0) == "worse"
    assert S.mean_sd([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, math.sqrt(5 / 3)))
    assert S.mean_sd([3.0]) == (3.0, None) and S.mean_sd([]) == (None, None)
    assert S.paired("ppl", {0: 11.0, 1: 22.0, 2: 5.0}, {0: 10.0, 1: 20.0}) == (
        [0, 1],
        [pytest.approx(10.0), pytest.approx(10.0)],
    )


@pytest.mark.parametrize(
    "metric, expect, diffs, verdict",
    [
        # strict: m 5.5, se 0.5 -> real (5.5 > 1.0 and > 2%) in the paper's direction
        ("ppl", "worse", [5.0, 6.0], S.REPRODUCED),
        ("ppl", "worse", [-5.0, -6.0], S.REVERSED),
        ("ppl", "worse", [5.0, -3.0], S.INCONCLUSIVE),  # m 1, se 4
        ("ppl", "worse", [1.5, 1.6], S.INCONCLUSIVE),  # consistent but under the 2% minimum
        ("ppl", "better", [-10.0, -20.0], S.REPRODUCED),  # m -15, 2 se = 10
        ("ppl", "better", [-10.0, -40.0], S.INCONCLUSIVE),  # m -25, 2 se = 30
        ("bleu", "better", [1.0, 0.8], S.REPRODUCED),  # m 0.9, 2 se 0.2, minimum 0.4
        ("bleu", "worse", [0.3, 0.35], S.INCONCLUSIVE),  # under the 0.4 BLEU minimum
        # tie: the whole band |m| + 2 se inside the minimum effect
        ("ppl", "tie", [0.2, -0.3], S.TIED),  # 0.05 + 0.5 <= 2
        ("ppl", "tie", [1.5, -1.0], S.INCONCLUSIVE),  # 0.25 + 2.5 > 2, not real
        ("ppl", "tie", [4.0, 5.0], S.NOT_A_TIE),  # real
        ("bleu", "tie", [0.0, 0.0, 0.0], S.TIED),  # no spread at all
        # one seed: no noise estimate, whatever the size
        ("ppl", "worse", [50.0], S.INCONCLUSIVE),
        ("ppl", "tie", [0.0], S.INCONCLUSIVE),
        ("ppl", "worse", [], S.NOT_RUN),
        ("bleu", None, [1.0, 1.2], S.NOT_JUDGED),
    ],
)
def test_golden_verdicts(metric, expect, diffs, verdict):
    assert S.judge(metric, expect, diffs).verdict == verdict


def test_bleu_tie_band_edge():
    # 0.3 and 0.35: m 0.325, se 0.025 -> band 0.375 <= 0.4: a tie, though neither is a strict gap
    j = S.judge("bleu", "tie", [0.3, 0.35])
    assert j.mean == pytest.approx(0.325) and j.se == pytest.approx(0.025)
    assert j.verdict == S.TIED and not j.real


def test_judgement_numbers():
    j = S.judge("ppl", "worse", [5.0, 6.0], seeds=(0, 1))
    assert (j.mean, j.sd, j.se) == pytest.approx((5.5, math.sqrt(0.5), 0.5))
    assert j.real and j.seeds == (0, 1)


def test_protocol_has_14_comparisons_classed_from_the_papers_numbers():
    assert len(S.PROTOCOL) == 14
    assert len({c.name for c in S.PROTOCOL}) == 14
    for c in S.PROTOCOL:
        assert c.row in ROWS and c.ref in ROWS
        assert c.section == S.section_of(c.row)
        for metric in S.METRICS:
            paper = S.paper_expectation(
                metric, getattr(ROWS[c.row], metric), getattr(ROWS[c.ref], metric)
            )
            assert paper == c.expect[metric], (c.name, metric, paper)
    # the classing rule on a few of the paper's gaps by hand
    assert S.paper_expectation("ppl", 5.29, 4.92) == "worse"  # A1: +7.5%
    assert S.paper_expectation("ppl", 5.01, 4.92) is None  # A32: +1.8%, between the bands
    assert S.paper_expectation("bleu", 25.5, 25.8) == "tie"  # -0.3 (float noise rounded off)
    assert S.paper_expectation("bleu", 25.3, 25.8) == "worse"  # -0.5


# Per comparison, the row's PPL as a factor of its reference's per seed (None: not run), built so
# that every verdict appears: (expected verdict, seed-0 factor, seed-1 factor).
DESIGN = {
    "A1": (S.REPRODUCED, 1.10, 1.12),
    "A16": (S.TIED, 1.002, 0.999),
    "B16": (S.REVERSED, 0.90, 0.88),
    "C2": (S.REPRODUCED, 1.10, 1.20),
    "C8": (S.NOT_A_TIE, 1.05, 1.06),
    "C256": (S.INCONCLUSIVE, 1.10, 0.95),
    "C1024": (S.REPRODUCED, 0.95, 0.94),
    "Cff4096": (S.REPRODUCED, 0.96, 0.95),  # against Cff1024
    "D0.0": (S.REPRODUCED, 1.20, 1.25),
    "D0.2": (S.TIED, 1.001, 1.002),
    "Dls0.0": (S.REPRODUCED, 0.97, 0.975),
    "Dls0.2": (S.INCONCLUSIVE, 1.10, None),  # one seed only
    "E": (S.INCONCLUSIVE, 1.03, 0.97),
    "big": (S.NOT_RUN, None, None),
}
BASE = {0: (10.0, 20.0), 1: (20.0, 30.0)}  # seed -> (PPL, BLEU)


def synthetic_results():
    results = []
    ppl = {("base", s): v[0] for s, v in BASE.items()}
    ppl[("Cff1024", 0)], ppl[("Cff1024", 1)] = 10.4, 20.8
    for c in S.PROTOCOL:
        _, *factors = DESIGN[c.row]
        for seed, f in enumerate(factors):
            if f is not None:
                ppl[(c.row, seed)] = ppl[(c.ref, seed)] * f
    for (row, seed), value in ppl.items():
        results.append({"row": row, "seed": seed, "ppl": value, "bleu": BASE[seed][1]})
    return results


def test_protocol_verdicts_and_summary_line():
    # the first protocol's rule: each comparison's own sd (the pooled rule: below)
    judged = S.judge_protocol(synthetic_results(), pooled=False)
    assert [j["ppl"].verdict for j in judged] == [DESIGN[c.row][0] for c in S.PROTOCOL]
    a1 = judged[0]["ppl"]
    assert a1.mean == pytest.approx(11.0) and a1.sd == pytest.approx(math.sqrt(2)) and a1.real
    assert S.summary_line(judged) == (
        "8 of 14 comparisons reproduced or tied as in the paper (6 reproduced, "
        "2 tie as in the paper, 1 reversed, 1 not a tie (real difference), "
        "3 inconclusive (within noise), 1 not run)"
    )
    # BLEU equal to base's everywhere: the expected ties hold (Dls0.2 has one seed), the
    # strict orderings are inconclusive, big was not run
    assert S.summary_line(judged, "bleu") == (
        "5 of 14 comparisons reproduced or tied as in the paper (5 tie as in the paper, "
        "8 inconclusive (within noise), 1 not run)"
    )


def test_summary_of_nothing_run():
    judged = S.judge_protocol([])
    assert S.summary_line(judged) == (
        "0 of 14 comparisons reproduced or tied as in the paper (14 not run)"
    )


CURVE = [(100 * (i + 1), v) for i, v in enumerate(
    [5.0, 4.0, 3.4, 3.1, 3.02, 2.996, 2.99, 2.992, 2.991, 2.993]
)]  # fmt: skip


def test_plateau_step_on_a_synthetic_curve():
    # 3.02 at step 500 still has 0.03 to gain; 2.996 at 600 only 0.006 (<= 0.01)
    assert S.plateau_step(CURVE) == 600
    assert S.plateau_step(CURVE, threshold=0.001) == 700  # 2.99 is the minimum
    assert S.plateau_step(CURVE, threshold=0.5) == 300  # 3.4 - 2.99 = 0.41
    still_improving = [(s, 5.0 - 0.1 * i) for i, (s, _) in enumerate(CURVE)]
    assert S.plateau_step(still_improving) is None
    overfitting = [(100, 3.0), (200, 2.5), (300, 2.6), (400, 2.8), (500, 3.0)]
    assert S.plateau_step(overfitting) == 200
    # the last evals cannot confirm themselves: a flat end of only one later point is not enough
    assert S.plateau_step([(100, 3.0), (200, 2.0), (300, 2.0)]) is None
    assert S.plateau_step([(100, 3.0), (200, 2.0), (300, 2.0)], min_after=1) == 200
    assert S.plateau_step([]) is None


def test_bleu_checkpoint_is_the_recorded_one_else_best_only_where_best_is_latest():
    curve = [(100, 3.0), (200, 2.5), (300, 2.7)]  # best at 200, latest 300
    assert S.bleu_checkpoint({"dev_curve": curve}) == "latest"  # an old run: the latest's BLEU
    assert S.bleu_checkpoint({"dev_curve": curve[:2]}) == "best"  # its best is its latest
    assert S.bleu_checkpoint({"dev_curve": curve, "bleu_at": "best"}) == "best"  # the runner's
    assert S.bleu_checkpoint({"dev_curve": []}) is None and S.bleu_checkpoint({}) is None


def test_best_point_is_the_lowest_evaluation_earliest_first():
    assert S.best_point(CURVE) == (700, 2.99)
    assert S.best_point(CURVE, upto=650) == (600, 2.996)  # read at a step: only what came before
    assert S.best_point([(300, 2.0), (100, 2.5), (200, 2.0)]) == (200, 2.0)  # a tie: the earlier
    assert S.best_point([]) is None and S.best_point(CURVE, upto=50) is None


def test_late_gain_and_end_over_best():
    # evals every 100 to 1,000: the last 20% starts after step 800; the loss there minus the
    # lowest after it
    curve = [(100 * i, 4.0 - 0.1 * i) for i in range(1, 11)]  # 3.9 ... 3.0, still falling
    assert S.late_gain(curve) == pytest.approx(3.2 - 3.0)
    assert S.late_gain(curve, fraction=0.5) == pytest.approx(3.5 - 3.0)
    assert S.end_over_best(curve) == pytest.approx(0.0)
    rising = [(100, 3.0), (200, 2.5), (300, 2.6), (400, 2.8), (500, 3.0)]
    assert S.late_gain(rising) == 0.0  # 2.8 at 400, then only higher
    assert S.end_over_best(rising) == pytest.approx(100 * (math.exp(0.5) - 1))
    assert S.late_gain([(100, 3.0)]) is None and S.end_over_best([]) is None
    assert S.late_gain([(900, 3.0), (1000, 2.9)]) is None  # no eval before the last 20%


def test_dev_curve_reads_metrics_jsonl(tmp_path):
    records = [
        {"step": 50, "kind": "train", "loss": 9.0, "nll": 8.0},
        {"step": 100, "kind": "eval", "loss": 4.5, "nll": 4.0, "ppl": math.exp(4.0)},
        {"step": 200, "kind": "eval", "ppl": math.exp(3.0)},  # no nll: log PPL
        {"step": 300, "kind": "eval", "loss": 2.5},  # only a loss
        {"step": 200, "kind": "eval", "nll": 2.9},  # a resumed run's repeat: the later wins
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = S.dev_curve(read_metrics(str(tmp_path)))
    assert curve == [(100, 4.0), (200, 2.9), (300, 2.5)]


def test_a_metrics_line_cut_short_is_skipped_with_a_warning(tmp_path, caplog):
    """A full disk or a kill mid-append leaves half a line, and the resumed run appends its
    first record onto it: that one line is lost, the curve and `plot` are not."""
    good = [{"step": 100, "kind": "eval", "nll": 4.0}, {"step": 300, "kind": "eval", "nll": 2.5}]
    cut = json.dumps({"step": 200, "kind": "eval", "nll": 3.0})[:17]
    text = json.dumps(good[0]) + "\n" + cut + json.dumps(good[1]) + "\n" + json.dumps(good[1])
    (tmp_path / "metrics.jsonl").write_text(text + "\n")
    with caplog.at_level("WARNING"):
        assert read_metrics(str(tmp_path)) == [good[0], good[1]]
    assert "skipped 1 line(s) that are not whole JSON" in caplog.text


def test_report_from_synthetic_results(tmp_path):
    root = str(tmp_path / "runs")
    results = []
    for r in synthetic_results():
        overrides = presets.run_overrides("small", r["row"], r["seed"], root)
        r = dict(r, overrides=overrides, params=2.4e6)
        r["plateau_step"] = 300 if r["row"] == "base" else None
        results.append(r)
    written = R.write_table("small", results, str(tmp_path / "out"), "cmd", [0, 1], 1200, 3600)
    md = (tmp_path / "out" / "table3_small.md").read_text()
    # the pooled rule: DESIGN's spread (C256's seeds +10% and -5%, C2's +10% and +20%, ...)
    # pools to sd 4.07% on 12 df, so a difference is real past t 4.07 / sqrt(2) = 6.27%
    assert ("**3 of 14 comparisons reproduced or tied as in the paper (3 reproduced, 1 "
            "reversed, 9 inconclusive (within noise), 1 not run)**") in md  # fmt: skip
    assert (
        "- PPL: pooled sd 4.07% on 12 df (12 comparisons), t = 2.18; a difference is real "
        "past 6.27% at n = 2" in md
    )
    assert "- Seeds: 0, 1 for every row." in md
    assert "every row 1,200 steps of equal-token batches (the same token budget); big 3,600" in md
    # the protocol table: the paper's numbers and what they lead us to expect
    assert "| 1 | A | A1 vs base | one head is worse than 8 (§6.2) | 4.92 -> 5.29 (+7.5%) |" in md
    assert "| 8 | C | Cff4096 vs Cff1024 |" in md
    assert "| 1 | A1 vs base | worse (+7.5%) | +11.0% ± 1.4%, n=2 | 6.3% | reproduced |" in md
    assert "| 14 | big vs base | better (-12.0%) | - | - | not run |" in md
    assert "| base | 3 | 128 | 512 | 8 | 16 | 16 | 0.1 | 0.1 | 1200 | 2 | 15.00 ± 7.07 |" in md
    assert any(p.endswith("table3_small.png") for p in written)
    with open(tmp_path / "out" / "table3_small_seeds.csv") as f:
        assert len(f.readlines()) == 1 + len(results)
    data = {d["row"]: d for d in R.chart_data(results)}
    assert "base" not in data and data["A1"]["section"] == "A"
    assert data["A1"]["ppl"]["ours"] == pytest.approx(11.0)
    assert data["A1"]["ppl"]["band"] == pytest.approx(2 * 1.0)  # 2 se, se = sqrt(2)/sqrt(2)
    assert data["A1"]["ppl"]["paper"] == pytest.approx(100 * (5.29 / 4.92 - 1))
    assert data["Dls0.2"]["ppl"]["band"] is None  # one seed: no band


def test_primary_metric_is_the_best_checkpoints_dev_ppl(tmp_path):
    curve = [(120, math.log(9.0)), (240, math.log(7.0)), (360, math.log(7.5))]
    r = {"row": "base", "seed": 0, "ppl": 7.5, "bleu": 30.0, "dev_curve": curve}
    best = R.at_best_checkpoint(r)
    assert best["ppl"] == pytest.approx(7.0) and best["best_step"] == 240
    assert best["ppl_latest"] == 7.5 and best["bleu"] == 30.0
    assert R.at_best_checkpoint(best) == best  # applied once, whatever the caller does
    assert R.at_best_checkpoint({**r, "dev_curve": []})["ppl"] == 7.5  # no curve: the latest


def curve_of(ppls, every=120):
    return [[every * (i + 1), math.log(p)] for i, p in enumerate(ppls)]


def test_curve_gap_and_trajectory_pair_seeds_at_shared_steps():
    ref = curve_of([10.0, 8.0, 7.0, 6.5])
    row = curve_of([11.0, 8.0, 6.3])  # a shorter curve: only the steps both have
    gap = E.curve_gap(row, ref)
    assert gap == {120: pytest.approx(10.0), 240: pytest.approx(0.0), 360: pytest.approx(-10.0)}
    # two seeds (gaps +10/-10 and +20/0 at 120/240); seed 2 has no reference run
    rows = {0: curve_of([11.0, 7.2]), 1: curve_of([12.0, 8.0]), 2: curve_of([9.0, 9.0])}
    refs = {0: curve_of([10.0, 8.0]), 1: curve_of([10.0, 8.0])}
    assert E.gap_trajectory(rows, refs) == [
        (120, pytest.approx(15.0), 2),
        (240, pytest.approx(-5.0), 2),
    ]
    assert E.gap_trajectory({0: row}, {1: ref}) == []  # no paired seed


def test_trend_toward_away_and_stable():
    traj = [(120 * i, g, 2) for i, g in enumerate([20.0, 9.0, 6.0, 3.0, 1.0, -0.5], 1)]
    # mid = the step nearest half of 720 (360: +6.0), end = -0.5 at 720: change -6.5
    t = E.trend(traj, "better")
    assert (t["mid_step"], t["end_step"], t["way"]) == (360, 720, "toward")
    assert t["mid"] == pytest.approx(6.0) and t["end"] == pytest.approx(-0.5)
    assert E.trend(traj, "worse")["way"] == "away"
    assert E.trend(traj, "tie")["way"] == "toward"  # |-0.5| < |6.0|
    flat = [(120, 5.0, 2), (240, 4.0, 2), (360, 4.5, 2), (480, 5.5, 2)]
    assert E.trend(flat, "worse")["way"] == "stable"  # 4.0 at 240 -> 5.5: under 2%
    assert E.trend(flat[:1], "worse") is None


def test_readings_by_fixed_thresholds():
    two = S.judge("ppl", "worse", [-4.0, -5.0], (0, 1))  # reversed
    quiet = {"late_gain": 0.01, "end_over_best": 0.0}
    assert E.reading(S.judge("ppl", "worse", [39.0], (0,)), None, quiet, quiet).startswith(
        "one seed"
    )
    over = {"late_gain": 0.0, "end_over_best": 60.0}
    assert E.reading(two, None, over, quiet).startswith("over-fitting: the row's dev PPL rose 60%")
    assert E.reading(two, None, quiet, over).startswith("the reference over-fits")
    toward = {"mid_step": 600, "mid": -8.0, "end_step": 1200, "end": -4.5, "way": "toward"}
    learning = {"late_gain": 0.06, "end_over_best": 0.0}
    assert E.reading(two, toward, learning, quiet).startswith("budget-limited")
    # closing, but the row is no longer learning faster than base: not budget-limited
    assert E.reading(two, toward, quiet, quiet).startswith("a stable difference")
    away = dict(toward, mid=0.0, end=-4.1, way="away")
    assert E.reading(two, away, quiet, quiet).startswith("a growing difference")
    assert "the gap would likely grow" not in E.reading(two, away, quiet, quiet)
    # what the curves show, and no guess about what a longer budget would do
    assert E.reading(two, away, learning, quiet).endswith(
        "(late gain 0.060 nats, the reference's 0.010); what a longer budget would do is "
        "untested here"
    )
    assert "would not reproduce" not in E.reading(two, away, quiet, quiet)
    small = S.judge("ppl", "tie", [1.0, 2.5], (0, 1))  # m 1.75, 2 se 1.5: inconclusive
    assert E.reading(small, None, quiet, quiet).startswith("a small difference")
    noisy = S.judge("ppl", "worse", [1.0, 9.0], (0, 1))
    assert E.reading(noisy, None, quiet, quiet).startswith("seed noise")


def test_beyond_reference_for_a_row_trained_longer():
    # base: 4 evaluations to step 480; the row (3x budget): 12 to step 1440
    ref = {0: curve_of([10.0, 8.0, 7.0, 6.0]), 1: curve_of([10.0, 8.0, 7.0, 6.0])}
    row = {
        0: curve_of([12.0, 10.0, 9.0, 8.0, 7.5, 7.0, 6.8, 6.5, 6.4, 6.3, 6.4, 6.6]),
        1: curve_of([12.0, 10.0, 9.0, 8.0, 7.5, 7.0, 6.8, 6.5, 6.4, 6.3, 6.4, 6.6]),
    }

    # as the report reads them: PPL at the best checkpoint, its step, the end-of-budget PPL
    def runs(curves):
        return [R.at_best_checkpoint({"seed": seed, "ppl": math.exp(c[-1][1]), "dev_curve": c})
                for seed, c in curves.items()]  # fmt: skip

    b = E.beyond_reference(runs(row), runs(ref))
    assert (b["ref_end"], b["best_step"], b["n"]) == (480, 1200, 2)
    assert b["at_ref_end"] == pytest.approx(8.0) and b["best"] == pytest.approx(6.3)
    assert b["end"] == pytest.approx(6.6) and b["ref_best"] == pytest.approx(6.0)
    # same budget (no step past the reference's end): nothing to say
    assert E.beyond_reference(runs(ref), runs(ref)) is None
    assert E.beyond_reference(runs({0: row[0]}), runs({1: ref[1]})) is None  # no paired seed
    two = S.judge("ppl", "better", [5.0, 5.0], (0, 1))  # big expected better, is worse
    quiet = {"late_gain": 0.01, "end_over_best": 0.0}
    text = E.reading(two, None, quiet, quiet, b)
    assert text == (
        "what the longer budget bought: at the reference's last step (480) the row's dev PPL "
        "was 8.00; its later steps took it 21% lower, to 6.30 at step 1200, +5.0% against the "
        "reference's best 6.00; it had stopped learning (late gain within the margin of the "
        "reference's)"
    )
    learning = {"late_gain": 0.06, "end_over_best": 0.0}
    assert E.reading(two, None, learning, quiet, b).endswith(
        "it was still learning at the end of its own budget (late gain 0.060 nats, the "
        "reference's 0.010)"
    )
    # over-fitting still comes first, and noise is not explained away by the budget
    over = {"late_gain": 0.0, "end_over_best": 60.0}
    assert E.reading(two, None, over, quiet, b).startswith("over-fitting")
    noisy = S.judge("ppl", "better", [1.0, 9.0], (0, 1))
    assert E.reading(noisy, None, quiet, quiet, b).startswith("seed noise")


def test_spearman():
    assert E.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert E.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert E.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert E.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # tied ranks
    assert E.spearman([1, 2], [1, 2]) is None and E.spearman([1, 1, 1], [1, 2, 3]) is None


def test_report_explains_disagreements_from_the_curves(tmp_path):
    root = str(tmp_path / "runs")
    results = []
    for r in synthetic_results():
        factor = r["ppl"] / BASE[r["seed"]][0] if r["row"] != "Cff4096" else 1.0
        # base falls 30 -> its PPL; every row follows with its own factor at every step
        curve = curve_of([3 * BASE[r["seed"]][0] * factor, r["ppl"]])
        o = presets.run_overrides("small", r["row"], r["seed"], root)
        results.append(dict(r, overrides=o, params=2.4e6, dev_curve=curve))
    for seed, (base_ppl, bleu) in BASE.items():  # big, 3x base's steps, ends 30% above base
        big = curve_of([4 * base_ppl, 2 * base_ppl, 1.5 * base_ppl, 1.4 * base_ppl,
                        1.3 * base_ppl, 1.3 * base_ppl])  # fmt: skip
        o = presets.run_overrides("small", "big", seed, root)
        results.append({"row": "big", "seed": seed, "ppl": 1.3 * base_ppl, "bleu": bleu,
                        "overrides": o, "params": 9e6, "dev_curve": big})  # fmt: skip
    R.write_table("small", results, str(tmp_path / "out"), "cmd", [0, 1], 1200, 3600)
    md = (tmp_path / "out" / "table3_small.md").read_text()
    section = md.split("## Why the others came out as they did")[1].split("## Rows")[0]
    # big ran past base's last evaluation (step 240 here): what its own budget bought
    assert "**big vs base** (big (3x steps) is better): reversed, expected better" in section
    # at 240: 2x base's PPL (seed-mean of the logs: 2 * sqrt(10 * 20) = 28.28); best 1.3x,
    # first reached at 600
    assert ("- Past base's budget (its last evaluation, step 240): the row's dev PPL 28.28 "
            "there, best 18.38 at step 600, end 18.38; base's best 14.14 (means over 2 "
            "seeds).") in section  # fmt: skip
    assert "what the longer budget bought: at the reference's last step (240)" in section
    # B16 (reversed) and C8 (inconclusive under the pooled noise) are explained; A1
    # (reproduced) is not
    assert "**B16 vs base** (reducing d_k to 16 hurts (§6.2)): reversed, expected worse" in section
    assert "- Per seed (0, 1): -10.0%, -12.0% (same sign in every seed)." in section
    assert "- Gap over training (step: row vs base): 120: -11.0%, 240: -11.0%." in section
    assert "**C8 vs base**" in section and "**A1 vs base**" not in section
    # B16's item points at the A/B rows. PPL by d_k 128/16/8/4 (A1, base, A16, B16): 16.7, 15.0,
    # 15.0 (a tie), 13.3: ranks 3, 1.5, 1.5, 0 against 3, 2, 1, 0 -> 4.5 / sqrt(5 * 4.5)
    assert "Across the 4 A and B rows run, dev PPL's rank correlation with d_k is +0.95" in section
    assert "and with h -0.50 (the table under Rows)." in section
    assert "**Dls0.2 vs base**" in section and "one seed: no noise estimate yet" in section
    # the heads table: A1 (d_k 128), base (16), A16 (8), B16 (4)
    heads = md.split("## Heads and per-head width (rows A and B)")[1]
    assert "| A1 | 1 | 128 | 128 | 2 |" in heads and "| B16 | 8 | 4 | 16 | 2 |" in heads


def test_pooled_noise_by_hand():
    # deviations about each group's own mean: (1, 3) -> 2, (2, 2) -> 0, (0, 4, 8) -> 32; a
    # one-seed group adds nothing
    noise = S.pooled_noise([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0, 8.0], [5.0]])
    assert noise.df == 4 and noise.comparisons == 3
    assert noise.sd == pytest.approx(math.sqrt(34 / 4))
    assert noise.multiple() == pytest.approx(2.776445, abs=1e-6)  # Student's t, 97.5%, 4 df
    assert S.pooled_noise([[1.0]]) is None


def test_pooled_rule_judges_by_the_shared_noise():
    noise = S.Noise(sd=1.6, df=12, comparisons=12)
    t = 2.178813  # Student's t, 97.5%, 12 df
    assert noise.multiple() == pytest.approx(t, abs=1e-6)
    # two identical seeds: the own-sd rule sees no noise at all and calls 2.4% real; the pooled
    # rule's threshold is t 1.6 / sqrt(2) = 2.465
    assert S.judge("ppl", "worse", [2.4, 2.4]).real
    j = S.judge("ppl", "worse", [2.4, 2.4], noise=noise)
    assert not j.real and j.verdict == S.INCONCLUSIVE
    assert j.threshold == pytest.approx(t * 1.6 / math.sqrt(2)) and j.sd == 0.0
    assert S.judge("ppl", "worse", [3.0, 2.0], noise=noise).verdict == S.REPRODUCED
    # the minimum effect still applies where the pooled band is narrower
    small = S.Noise(sd=0.1, df=12, comparisons=12)
    assert S.judge("ppl", "worse", [1.9, 1.9], noise=small).verdict == S.INCONCLUSIVE
    assert S.judge("ppl", "tie", [0.1, -0.1], noise=small).verdict == S.TIED
    # one seed: inconclusive whatever the pooled noise
    assert S.judge("ppl", "worse", [9.0], noise=noise).verdict == S.INCONCLUSIVE


def test_tie_power():
    noise = S.Noise(sd=1.6, df=12, comparisons=12)
    # n = 2: t se = 2.465 > 2: no tie can be called
    assert S.tie_power(noise, 2, 2.0) == 0.0
    # n = 6: room 2 - t 1.6/sqrt(6) = 0.5768; 2 Phi(0.5768 / 0.6532) - 1
    se = 1.6 / math.sqrt(6)
    room = 2.0 - 2.178813 * se
    phi = 0.5 * (1 + math.erf(room / se / math.sqrt(2)))
    assert S.tie_power(noise, 6, 2.0) == pytest.approx(2 * phi - 1, abs=1e-5)
    # the first protocol's rule at n = 2 calls a true tie a tie ~38% of the time at sd 1.57
    assert S.own_sd_tie_power(2, 2.0, 1.57) == pytest.approx(0.38, abs=0.01)


def curve_to(ppl_at: dict) -> list:
    return [[step, math.log(p)] for step, p in sorted(ppl_at.items())]


def run(row, seed, ppl, variant=None, curve=None):
    return {"row": row, "seed": seed, "variant": variant,
            "dev_curve": curve or curve_to({1200: ppl})}  # fmt: skip


def test_explanation_outcomes_by_their_registered_rules():
    noise = S.Noise(sd=1.0, df=12, comparisons=12)
    base = [run("base", s, 10.0) for s in (0, 1)]
    e = [run("E", s, 10.6) for s in (0, 1)]  # +6%
    exp = X.BY_NAME["E"]
    assert X.outcome(exp, base + e, noise)["outcome"] == V.PENDING
    assert "to run: E-std1 seed 0, E-std1 seed 1" in X.outcome(exp, base + e, noise)["details"][0]
    std1 = lambda p: [run("E-std1", s, p) for s in (0, 1)]  # noqa: E731
    assert X.outcome(exp, base + e + std1(10.2), noise)["outcome"] == V.SUPPORTED  # +2%
    assert X.outcome(exp, base + e + std1(10.55), noise)["outcome"] == V.REFUTED  # +5.5%
    assert X.outcome(exp, base + e + std1(10.4), noise)["outcome"] == V.INCONCLUSIVE  # +4%
    # its own runs finished before the runs it compares with (a sweep running beside it): pending,
    # naming them, not a rule computed on half the runs
    early = X.outcome(exp, base[:1] + std1(10.2), noise)
    assert early["outcome"] == V.PENDING
    assert early["details"] == ["its runs are finished; the sweep's to finish: base seed 1, "
                                "E seed 0, E seed 1"]  # fmt: skip

    # heads: same d_k ties, same h differs as predicted -> supported; two same-d_k pairs real
    # -> refuted
    ppl = {"base": 10.0, "A4": 9.6, "A16": 10.4, "H1K64": 10.05, "H16K64": 9.95,
           "H8K128": 9.62, "H8K32": 10.35}  # fmt: skip
    rows = lambda p: [run(r, s, v) for r, v in p.items() for s in (0, 1)]  # noqa: E731
    heads = X.BY_NAME["heads"]
    assert X.outcome(heads, rows(ppl), noise)["outcome"] == V.SUPPORTED
    worse = dict(ppl, H1K64=11.0, H16K64=9.0)
    assert X.outcome(heads, rows(worse), noise)["outcome"] == V.REFUTED
    one = dict(ppl, H1K64=11.0)
    assert X.outcome(heads, rows(one), noise)["outcome"] == V.INCONCLUSIVE

    # budget: the gap at the best of 2,400 steps against the best of the first 1,200
    def long(row, at1200, at2400):
        return [run(row, s, None, "s2400", curve_to({1200: at1200, 2400: at2400})) for s in (0, 1)]

    # big at its own 3x: the best of its first 3,600 steps, then of 7,200, against base's
    # 1,200 and 2,400 (not its best by step 1,200, nor one past 3,600)
    def big(at3600, at7200):
        curve = curve_to({1200: 12.0, 3600: at3600, 4800: min(at3600, 9.9), 7200: at7200})
        return [run("big", s, None, "s2400", curve) for s in (0, 1)]

    budget = X.BY_NAME["budget"]
    stays = long("base", 10.0, 9.0) + long("Cff1024", 10.0, 9.0)
    closes = stays + long("C8", 10.5, 9.05) + long("Cff4096", 10.0, 8.3)  # C8 +5 -> +0.6
    assert X.outcome(budget, closes + big(10.0, 8.0), noise)["outcome"] == V.SUPPORTED
    away = stays + long("C8", 10.5, 9.5) + long("Cff4096", 10.0, 9.2) + big(10.0, 9.0)
    assert X.outcome(budget, away, noise)["outcome"] == V.REFUTED
    mixed = stays + long("C8", 10.5, 9.05) + long("Cff4096", 10.0, 9.2) + big(10.0, 8.0)
    o = X.outcome(budget, mixed, noise)
    assert o["outcome"] == "mixed: C8 supported, Cff4096 refuted, big supported"
    assert o["by_row"] == {"C8": V.SUPPORTED, "Cff4096": V.REFUTED, "big": V.SUPPORTED}
    assert ("C8 vs base: best of 1,200 steps +5.0%, of 2,400 +0.6% (the paper -0.8%): +4.4 "
            "points nearer: supported") in o["details"]  # fmt: skip
    assert ("big vs base: best of 3,600 steps +0.0%, of 7,200 -11.1% (the paper -12.0%): "
            "+11.1 points nearer: supported") in o["details"]  # fmt: skip

    # data: every gap further from the paper's on 25% of the pairs -> supported
    def at(variant, gaps):
        out = [run("base", s, 10.0, variant) for s in (0, 1)]
        return out + [run(r, s, 10.0 * (1 + g / 100), variant) for r, g in gaps.items()
                      for s in (0, 1)]  # fmt: skip

    data = X.BY_NAME["data"]
    full = {"D0.2": -7.0, "Dls0.0": 9.0, "C1024": 1.0}
    further = at(None, full) + at("f50", {"D0.2": -9.0, "Dls0.0": 12.0, "C1024": 3.0})
    further += at("f25", {"D0.2": -12.0, "Dls0.0": 15.0, "C1024": 6.0})
    assert X.outcome(data, further, noise)["outcome"] == V.SUPPORTED
    flat = at(None, full) + at("f50", full) + at("f25", full)
    assert X.outcome(data, flat, noise)["outcome"] == V.REFUTED
    # further on 25% but nearer on 50% is no trend: inconclusive for that comparison
    zigzag = at(None, full) + at("f50", {"D0.2": -3.0, "Dls0.0": 12.0, "C1024": 3.0})
    zigzag += at("f25", {"D0.2": -12.0, "Dls0.0": 15.0, "C1024": 6.0})
    o = X.outcome(data, zigzag, noise)
    assert o["outcome"] == "mixed: D0.2 inconclusive, Dls0.0 supported, C1024 supported"
    assert ("D0.2 vs base on 100% / 50% / 25% of the pairs: -7.0% / -3.0% / -12.0% "
            "(the paper +0.6%): inconclusive") in o["details"]  # fmt: skip


def test_budget_and_data_read_so_far_and_judge_each_comparison_whose_runs_are_in():
    """A sweep still running: budget and data say what their complete pairs show so far, and a
    comparison whose own runs are all in has its verdict in the list of what tests it, while
    the experiment stays pending."""
    noise = S.Noise(sd=1.0, df=12, comparisons=12)

    def long(row, at1200, at2400, seeds=(0, 1)):
        return [run(row, s, None, "s2400", curve_to({1200: at1200, 2400: at2400})) for s in seeds]

    budget = X.BY_NAME["budget"]
    part = long("base", 10.0, 9.0) + long("C8", 10.5, 9.05) + long("Cff1024", 10.0, 9.0, (0,))
    o = X.outcome(budget, part, noise)
    assert o["outcome"] == V.PENDING
    assert o["details"][0].startswith("5 of 10 runs finished; to run: s2400/Cff1024 seed 1")
    assert o["details"][1].startswith("so far, C8 vs base: best of 1,200 steps +5.0%, of 2,400")
    assert o["details"][2:] == ["so far, Cff4096 vs Cff1024: (runs to come)",
                                "so far, big vs base: (runs to come)"]  # fmt: skip
    assert o["by_row"] == {"C8": V.SUPPORTED}
    # data: base and D0.2 on 50% of the pairs, nothing on 25% yet; each share's gap is a
    # percent of that share's own base (20.00 on half the pairs, not all's 10.00)
    main = [run(r, s, p) for r, p in (("base", 10.0), ("D0.2", 9.3), ("Dls0.0", 10.9),
                                      ("C1024", 10.1)) for s in (0, 1)]  # fmt: skip
    half = [run(r, s, p, "f50") for r, p in (("base", 20.0), ("D0.2", 18.0)) for s in (0, 1)]
    o = X.outcome(X.BY_NAME["data"], main + half, noise)
    assert o["outcome"] == V.PENDING and o["by_row"] == {}
    assert ("so far, D0.2 vs base on 100% / 50% / 25% of the pairs: -7.0% / -10.0% / (to come) "
            "(the paper +0.6%)") in o["details"]  # fmt: skip
    base = "so far, base's own dev PPL on 100% / 50% / 25% of the pairs: 10.00 / 20.00 / (to come)"
    assert base in o["details"]
    # the report's list: C8's own verdict under budget, Cff4096's pending
    lines = X.explanation_lines(main + part, noise, ["C8", "Cff4096"])
    assert "- C8: seed3 (pending), budget (supported)" in lines
    assert "- Cff4096: seed3 (pending), budget (pending)" in lines


def test_every_comparison_the_sweep_did_not_reproduce_has_an_experiment():
    """The registered experiments cover the comparisons the first sweep left unexplained, and
    each experiment's probe rows and variants exist."""
    for row in ("A1", "A16", "C8", "C1024", "Cff4096", "D0.2", "Dls0.0", "E"):
        assert X.experiments_for(row), row
    for variant, row, _ in X.run_list(list(X.BY_NAME)):
        assert row in presets.ALL_ROWS and (variant is None or variant in X.VARIANTS)
    # row by row through the variants: a sweep cut short leaves whole comparisons
    data = X.run_list(["data"])
    assert data[:6] == [("f50", "base", 0), ("f50", "base", 1), ("f25", "base", 0),
                        ("f25", "base", 1), ("f50", "D0.2", 0), ("f50", "D0.2", 1)]  # fmt: skip
    assert len(data) == len(set(data)) == 16


def test_a_rule_that_refutes_on_one_pair_is_decided_before_its_last_runs():
    """heads and seed3 refute on any one complete pair: once the complete pairs meet the rule,
    the outcome is "refuted", said to be decided early; support waits for every run."""
    noise = S.Noise(sd=1.0, df=12, comparisons=12)
    rows = lambda p, seeds=(0, 1): [run(r, s, v) for r, v in p.items() for s in seeds]  # noqa: E731
    heads = X.BY_NAME["heads"]
    # H8K128 not run; H1K64 and H16K64 (same d_k as base) are both really worse: refuted
    ppl = {"base": 10.0, "A4": 9.6, "A16": 10.4, "H1K64": 11.0, "H16K64": 11.0, "H8K32": 10.35}
    o = X.outcome(heads, rows(ppl), noise)
    assert o["outcome"] == V.REFUTED
    assert o["details"][0].startswith("decided early, with 6 of 8 runs finished")
    assert "(H8K128 seed 0, H8K128 seed 1) cannot undo" in o["details"][0]
    assert "- A1: heads (refuted)" in X.explanation_lines(rows(ppl), noise, ["A1"])
    assert "same d_k, other h: H1K64 vs base +10.0% (seeds +10.0%, +10.0%; real)" in o["details"]
    assert "same h = 8, other d_k: H8K128 vs base (runs to come)" in o["details"]
    # H16K64 with one seed is no pair yet, and one real pair refutes nothing: pending, with
    # the complete pairs so far
    one_seed = [r for r in rows(ppl) if (r["row"], r["seed"]) != ("H16K64", 1)]
    o = X.outcome(heads, one_seed, noise)
    assert o["outcome"] == V.PENDING
    assert o["details"][0] == "5 of 8 runs finished; to run: H16K64 seed 1, H8K128 seed 0, " \
                              "H8K128 seed 1"  # fmt: skip
    assert (
        "so far, same d_k, other h: H1K64 vs base +10.0% (seeds +10.0%, +10.0%; real)"
        in o["details"]
    )
    assert "so far, same d_k, other h: H16K64 vs base (runs to come)" in o["details"]
    # every complete pair as predicted: still pending, support is never early
    good = dict(ppl, H1K64=10.05, H16K64=9.95)
    assert X.outcome(heads, rows(good), noise)["outcome"] == V.PENDING
    # the sweep's rows it compares with unfinished (A4): pending, no early verdict
    assert X.outcome(heads, [r for r in rows(ppl) if r["row"] != "A4"], noise)["outcome"] == (
        V.PENDING
    )
    # seed3: Cff4096 really better than Cff1024 with seed 2 refutes it, whatever the other
    # rows' seed 2 will show
    main = {"base": 10.0, "Cff1024": 10.0, "Cff4096": 10.0, "C1024": 10.1, "A16": 10.4,
            "C8": 10.5, "D0.2": 9.3, "E": 10.6}  # fmt: skip
    seed2 = [run("Cff1024", 2, 10.0), run("Cff4096", 2, 9.7), run("base", 2, 10.0)]
    seed3 = X.BY_NAME["seed3"]
    o = X.outcome(seed3, rows(main) + seed2, noise)
    assert o["outcome"] == V.PENDING  # Cff4096 0%, 0%, -3%: -1% over 3 seeds is not real
    strong = [r for r in rows(main) if r["row"] != "Cff4096"] + rows({"Cff4096": 9.0})
    o = X.outcome(seed3, strong + seed2, noise)
    assert o["outcome"] == V.REFUTED and o["details"][0].startswith("decided early, with 3 of 8")
    assert "A16 vs base: 2 seeds +4.0%, seed 2 to come" in o["details"]
    # each comparison's own: Cff4096's pair refuted it; A16's seed 2 is still to come
    assert o["by_row"] == {"Cff4096": V.REFUTED}
    lines = X.explanation_lines(strong + seed2, noise, ["A16", "Cff4096"])
    assert "- Cff4096: seed3 (refuted), budget (pending)" in lines
    assert "- A16: heads (pending), seed3 (pending)" in lines
    # every seed 2 in, each as predicted: supported, and C1024 (no prediction) says so
    rest = [run(r, 2, main[r] * (0.999 if r == "Cff4096" else 1)) for r in main
            if r not in ("base", "Cff1024", "Cff4096")]  # fmt: skip
    full = rows(main) + seed2[:1] + [run("Cff4096", 2, 10.0), seed2[2]] + rest
    o = X.outcome(seed3, full, noise)
    assert o["outcome"] == V.SUPPORTED
    assert o["by_row"] == dict.fromkeys(("Cff4096", "A16", "C8", "D0.2", "E"), V.SUPPORTED) | {
        "C1024": "no prediction"
    }


def test_the_machines_line_names_the_few_runs_on_another_machine():
    """A pair with a run on another machine is not one trajectory but for the row: the report
    names the runs of every machine but the most common (while they are few)."""
    bf16, other = "cpu (AMD EPYC, bf16)", "cpu (AMD EPYC, no bf16)"
    runs = [{"row": r, "seed": s, "platform": bf16} for r in ("base", "D0.2") for s in (0, 1)]
    assert R.machines_line(runs) == f"Machines, 4 runs: 4 on {bf16}."
    runs += [{"row": "D0.2", "seed": 1, "variant": "f50", "platform": other}, {"row": "E"}]
    line = R.machines_line(runs)
    assert line.startswith(f"Machines, 6 runs: 4 on {bf16}; 1 on {other} (f50/D0.2 seed 1); "
                           "1 not recorded")  # fmt: skip
    assert "A pair across machines" in line
    many = [dict(runs[0], seed=s) for s in range(30)]
    many += [dict(runs[4], seed=s) for s in range(R.FEW_RUNS + 1)]
    assert f"; {R.FEW_RUNS + 1} on {other}. A pair" in R.machines_line(many)  # too many to name
