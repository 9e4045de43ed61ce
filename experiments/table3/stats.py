"""Table 3's pre-registered protocol and its statistics, as data and pure functions over numbers.

No runs, no JAX: the sweep (sweep.py) feeds these the (row, seed) results it collected, and
tests/unit/test_table3_stats.py checks them on hand-made numbers. What is fixed here before any
sweep runs (and written into the report's header):

- the 14 comparisons (PROTOCOL), each a row against a reference row (base, or Cff1024 for d_ff),
  with what the paper's own numbers lead us to expect per metric: "better", "worse" (a strict
  ordering) or "tie";
- how the paper's gaps were classed into those (PAPER_* thresholds; a unit test re-derives
  every expectation from configs/table3.py's numbers, so data and rule cannot drift apart);
- the primary metric (dev perplexity; dev BLEU secondary), the units of a difference, and the
  verdict rule (SE_MULTIPLE, MIN_EFFECT).

Revised after the first sweep (issue 34, before any run it judges): a comparison's standard
error comes from the paired differences of every comparison pooled (`pooled_noise`: one
variance, df = sum of n - 1), not from its own n = 2 (which gives t on 1 degree of freedom),
and the multiple is Student's t at 97.5% on those df. The tie rule's power, the chance that a
true tie is called a tie, is stated beside it (`tie_power`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats as scipy_stats

PRIMARY, SECONDARY = "ppl", "bleu"
METRICS = (PRIMARY, SECONDARY)

# How the paper's gaps (its single run per row) were classed, on the paper's own scale.
# PPL gaps are relative to the reference row's PPL; BLEU gaps are in points (the paper prints one
# decimal, so 0.1-0.3 is about the rounding and run-to-run noise of one run).
PAPER_TIE = {"ppl": 1.0, "bleu": 0.3}  # |gap| <= this: a tie (PPL in %)
PAPER_STRICT = {"ppl": 3.0, "bleu": 0.5}  # |gap| >= this: a strict ordering; between: not judged

# Our side. A paired difference is "real" when |mean| > SE_MULTIPLE x its standard error AND
# |mean| > MIN_EFFECT. MIN_EFFECT sits between the paper's tie and strict bands, in the same units.
SE_MULTIPLE = 2.0
MIN_EFFECT = {"ppl": 2.0, "bleu": 0.4}  # PPL: % of the reference row's PPL; BLEU: points

REPRODUCED = "reproduced"
TIED = "tie as in the paper"
REVERSED = "reversed"
INCONCLUSIVE = "inconclusive (within noise)"
NOT_A_TIE = "not a tie (real difference)"  # the paper ties, we measure a real gap
NOT_RUN = "not run"
NOT_JUDGED = "not judged"  # the paper's gap is between its tie and strict bands
AGREES = (REPRODUCED, TIED)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One pre-registered comparison: `row` against `ref`, expected per metric."""

    section: str  # the paper's Table 3 section: A, B, C, D, E or big
    row: str
    ref: str
    claim: str
    expect: dict  # metric -> "better" | "worse" | "tie" | None (not judged on that metric)

    @property
    def name(self) -> str:
        return f"{self.row} vs {self.ref}"


def _c(section, row, claim, ppl, bleu, ref="base"):
    return Comparison(section, row, ref, claim, {"ppl": ppl, "bleu": bleu})


# The paper's numbers behind each line (PPL / BLEU, ref -> row) are in configs/table3.py; the
# report prints them beside these. Rows of Table 3 not listed (A4, A32, B32, C4, Cff1024 on its
# own) have PPL gaps between the tie and strict bands or repeat a listed claim: the report shows
# their differences but counts no verdict for them.
PROTOCOL: tuple[Comparison, ...] = (
    _c("A", "A1", "one head is worse than 8 (§6.2)", "worse", "worse"),
    _c("A", "A16", "16 heads tie with 8", "tie", "tie"),
    _c("B", "B16", "reducing d_k to 16 hurts (§6.2)", "worse", "worse"),
    _c("C", "C2", "2 layers are worse than 6", "worse", "worse"),
    _c("C", "C8", "8 layers tie with 6 (the paper: PPL -0.04, BLEU -0.3)", "tie", "tie"),
    _c("C", "C256", "d_model 256 is worse", "worse", "worse"),
    _c("C", "C1024", "d_model 1024 is better in PPL, ties in BLEU", "better", "tie"),
    _c("C", "Cff4096", "d_ff 4096 beats d_ff 1024", "better", "better", ref="Cff1024"),
    _c("D", "D0.0", "no dropout is worse (§6.2)", "worse", "worse"),
    _c("D", "D0.2", "dropout 0.2 ties with 0.1", "tie", "tie"),
    _c("D", "Dls0.0", "no label smoothing: lower PPL, lower BLEU (§5.4)", "better", "worse"),
    _c("D", "Dls0.2", "label smoothing 0.2: higher PPL, BLEU ties", "worse", "tie"),
    _c("E", "E", "learned positions tie with sinusoids (§3.5)", "tie", "tie"),
    _c("big", "big", "big (3x steps) is better", "better", "better"),
)


def section_of(row: str) -> str:
    """The paper's section of a Table 3 row name (base -> "base")."""
    if row in ("base", "big"):
        return row
    return "C" if row.startswith("Cff") else row[0]


def difference(metric: str, row_value: float, ref_value: float) -> float:
    """One paired difference: PPL in % of the reference (100 (row/ref - 1)), BLEU in points."""
    if metric == "ppl":
        return 100.0 * (row_value / ref_value - 1.0)
    return row_value - ref_value


def direction(metric: str, diff: float) -> str:
    """ "better" or "worse" for the row: lower PPL and higher BLEU are better."""
    better = diff < 0 if metric == "ppl" else diff > 0
    return "better" if better else "worse"


def paper_expectation(metric: str, row_value: float, ref_value: float) -> str | None:
    """The class of one of the paper's gaps: "better", "worse", "tie" or None (between bands)."""
    gap = difference(metric, row_value, ref_value)
    # round away float noise: the paper's numbers have 2 (PPL) or 1 (BLEU) decimals
    size = round(abs(gap), 6)
    if size <= PAPER_TIE[metric]:
        return "tie"
    if size >= PAPER_STRICT[metric]:
        return direction(metric, gap)
    return None


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); sd None under two values, both None for none."""
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired(
    metric: str, row: dict[int, float], ref: dict[int, float]
) -> tuple[list[int], list[float]]:
    """Seeds both rows have, and per seed the row's difference from the reference."""
    seeds = sorted(set(row) & set(ref))
    return seeds, [difference(metric, row[s], ref[s]) for s in seeds]


@dataclasses.dataclass(frozen=True)
class Judgement:
    """Our paired differences on one metric of one comparison, and the verdict on them."""

    metric: str
    expect: str | None
    seeds: tuple[int, ...]
    mean: float | None
    sd: float | None  # this comparison's own spread over its seeds
    se: float | None  # the standard error the verdict used (pooled when `noise` was given)
    real: bool
    verdict: str
    threshold: float | None = None  # |m| above this (and MIN_EFFECT) is real


@dataclasses.dataclass(frozen=True)
class Noise:
    """The paired differences' spread pooled over comparisons: sd on df degrees of freedom."""

    sd: float
    df: int
    comparisons: int

    def multiple(self) -> float:
        """Student's t at 97.5% on df: a two-sided 95% band."""
        return float(scipy_stats.t.ppf(0.975, self.df))

    def se(self, n: int) -> float:
        return self.sd / math.sqrt(n)


def pooled_noise(groups: list[list[float]]) -> Noise | None:
    """One variance from every group of paired differences with n >= 2 (each about its own
    mean): sum of squared deviations over sum of (n - 1). None when no group has two."""
    groups = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return None
    ss = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in groups)
    return Noise(math.sqrt(ss / df), df, len(groups))


def tie_power(noise: Noise, n: int, floor: float) -> float:
    """The chance that a comparison with no true difference is called a tie at n seeds:
    P(|m| + t se <= floor) with m ~ Normal(0, se), se = noise.sd / sqrt(n) taken as known."""
    room = floor - noise.multiple() * noise.se(n)
    if room <= 0:
        return 0.0
    if noise.sd == 0:  # no noise: every true tie is called one
        return 1.0
    return float(2.0 * scipy_stats.norm.cdf(room / noise.se(n)) - 1.0)


def own_sd_tie_power(n: int, floor: float, sd: float, draws: int = 200_000) -> float:
    """The first protocol's tie power (its own sd at n seeds, 2 se), by simulation with a
    fixed seed: the chance a true tie (differences ~ Normal(0, sd)) is called a tie."""
    d = np.random.default_rng(0).normal(0.0, sd, size=(draws, n))
    m, s = d.mean(axis=1), d.std(axis=1, ddof=1)
    return float(np.mean(np.abs(m) + SE_MULTIPLE * s / math.sqrt(n) <= floor))


def judge(
    metric: str, expect: str | None, diffs: list[float], seeds=(), noise: Noise | None = None
) -> Judgement:
    """The verdict rule on the paired differences `diffs` (units of difference()).

    n = len(diffs), m their mean. With `noise` (pooled_noise over the comparisons): se =
    noise.sd / sqrt(n) and the multiple is Student's t on noise.df; without it, the first
    protocol's se = sd / sqrt(n) of this comparison alone and SE_MULTIPLE. The difference is
    real when n >= 2, |m| > multiple * se and |m| > MIN_EFFECT[metric].
      strict ("better"/"worse"): real in the paper's direction -> reproduced; real the other
          way -> reversed; not real -> inconclusive (within noise).
      tie: |m| + SE_MULTIPLE * se <= MIN_EFFECT -> tie as in the paper (the whole noise band
          inside the smallest effect we call real); real -> not a tie; else inconclusive.
      One seed gives no noise estimate: inconclusive. No common seed: not run.
    """
    seeds = tuple(seeds)
    if not diffs:
        return Judgement(metric, expect, seeds, None, None, None, False, NOT_RUN)
    m, sd = mean_sd(diffs)
    multiple = SE_MULTIPLE if noise is None else noise.multiple()
    if sd is None:  # one seed: no verdict, whatever the pooled noise says
        se = None
    else:
        se = noise.se(len(diffs)) if noise is not None else sd / math.sqrt(len(diffs))
    floor = MIN_EFFECT[metric]
    threshold = None if se is None else max(multiple * se, floor)
    real = se is not None and abs(m) > multiple * se and abs(m) > floor
    if expect is None:
        verdict = NOT_JUDGED
    elif se is None:
        verdict = INCONCLUSIVE
    elif expect == "tie":
        if real:
            verdict = NOT_A_TIE
        elif abs(m) + multiple * se <= floor:
            verdict = TIED
        else:
            verdict = INCONCLUSIVE
    elif real:
        verdict = REPRODUCED if direction(metric, m) == expect else REVERSED
    else:
        verdict = INCONCLUSIVE
    return Judgement(metric, expect, seeds, m, sd, se, real, verdict, threshold)


def by_row_seed(results: list[dict], metric: str) -> dict[str, dict[int, float]]:
    """{row: {seed: value}} from per-(row, seed) result dicts ("row", "seed", metric)."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        out.setdefault(r["row"], {})[int(r.get("seed", 0))] = float(r[metric])
    return out


def protocol_diffs(results: list[dict], protocol=PROTOCOL) -> list[dict[str, tuple]]:
    """For each comparison, {metric: (seeds, paired differences)}."""
    tables = {metric: by_row_seed(results, metric) for metric in METRICS}
    return [
        {m: paired(m, tables[m].get(c.row, {}), tables[m].get(c.ref, {})) for m in METRICS}
        for c in protocol
    ]


def protocol_noise(results: list[dict], protocol=PROTOCOL) -> dict[str, Noise | None]:
    """Per metric, the paired differences' noise pooled over the protocol's comparisons."""
    diffs = protocol_diffs(results, protocol)
    return {m: pooled_noise([d[m][1] for d in diffs]) for m in METRICS}


def judge_protocol(
    results: list[dict], protocol=PROTOCOL, pooled: bool = True
) -> list[dict[str, Judgement]]:
    """For each comparison of the protocol, {metric: Judgement} over the seeds both rows have;
    the standard error from the noise pooled over the comparisons (pooled=False: the first
    protocol's, each comparison's own)."""
    noise = protocol_noise(results, protocol) if pooled else {m: None for m in METRICS}
    out = []
    for c, d in zip(protocol, protocol_diffs(results, protocol), strict=True):
        out.append({
            m: judge(m, c.expect[m], d[m][1], d[m][0], noise[m]) for m in METRICS
        })  # fmt: skip
    return out


def summary_line(judgements: list[dict[str, Judgement]], metric: str = PRIMARY) -> str:
    """`N of 14 comparisons reproduced or tied as in the paper` and the count of each verdict."""
    verdicts = [j[metric].verdict for j in judgements if j[metric].expect is not None]
    held = sum(v in AGREES for v in verdicts)
    order = (REPRODUCED, TIED, REVERSED, NOT_A_TIE, INCONCLUSIVE, NOT_RUN)
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in order if verdicts.count(v))
    return f"{held} of {len(verdicts)} comparisons reproduced or tied as in the paper" + (
        f" ({counts})" if counts else ""
    )


def run_name(variant: str | None, row: str, seed: int) -> str:
    """How the report, the explanations and the machine checks name one run: "f25/base seed 0",
    "C8 seed 1"."""
    return f"{variant + '/' if variant else ''}{row} seed {seed}"


# ---- the budget: where base's dev loss stops improving ----


def dev_curve(records: list[dict]) -> list[tuple[int, float]]:
    """(step, dev NLL) of the eval records, by step; NLL = log PPL, else the logged loss.

    A resumed run can log a step twice; the later record wins.
    """
    curve = {}
    for r in records:
        if r.get("kind") != "eval":
            continue
        if "nll" in r:
            value = r["nll"]
        elif "ppl" in r:
            value = math.log(r["ppl"])
        else:
            value = r["loss"]
        curve[int(r["step"])] = float(value)
    return sorted(curve.items())


def best_point(curve: list[tuple[int, float]], upto: int | None = None) -> tuple[int, float] | None:
    """The best evaluation of a dev curve, (step, NLL): the lowest NLL at or before step `upto`
    (all of it by default); on equal NLL the earlier step. None without an evaluation there.
    The one definition of "the best checkpoint" for the runner (which keeps it), the report
    (which reads PPL there) and the explanation experiments (which read it at a step)."""
    points = [(int(s), float(v)) for s, v in curve if upto is None or s <= upto]
    if not points:
        return None
    return min(points, key=lambda point: (point[1], point[0]))


def bleu_checkpoint(result: dict) -> str | None:
    """Which checkpoint a result's BLEU was taken at: the recorded "bleu_at" where there is one
    (runner.py records "best" since the explanation sweep, as does a replay); else, from the
    dev curve, "best" where its best evaluation is its last and "latest" where it is not; None
    with neither. The one reading of it for the report (which marks "latest" with a dagger)
    and the replay (which mends it)."""
    curve = result.get("dev_curve") or []
    best = best_point(curve)
    if result.get("bleu_at") or best is None:
        return result.get("bleu_at")
    return "best" if best[0] == max(int(s) for s, _ in curve) else "latest"


def plateau_step(
    curve: list[tuple[int, float]], threshold: float = 0.01, min_after: int = 2
) -> int | None:
    """The first eval step after which dev loss never improves by more than `threshold`.

    That is the first step s with loss(s) - min(loss after s) <= threshold, confirmed by at
    least `min_after` later evals; None when no step qualifies (still improving, or too few
    evals to tell). The default 0.01 nats is ~1% of PPL, the paper's tie band.
    """
    for i, (step, value) in enumerate(curve):
        later = [v for _, v in curve[i + 1 :]]
        if len(later) < min_after:
            return None
        if value - min(later) <= threshold:
            return step
    return None


def late_gain(curve: list[tuple[int, float]], fraction: float = 0.2) -> float | None:
    """How much dev NLL (nats) still fell in the last `fraction` of the run: the loss at the
    last eval at or before (1 - fraction) of the final step, minus the lowest loss after it.
    Near 0: the run had converged at its budget; large: it was still learning (a row slower to
    train than base is then judged early). None without an eval in both parts."""
    if len(curve) < 2:
        return None
    cut = (1.0 - fraction) * curve[-1][0]
    before = [i for i, (step, _) in enumerate(curve) if step <= cut]
    if not before or before[-1] == len(curve) - 1:
        return None
    i = before[-1]
    return max(0.0, curve[i][1] - min(v for _, v in curve[i + 1 :]))


def end_over_best(curve: list[tuple[int, float]]) -> float | None:
    """The end-of-budget dev PPL over the best's, in % (> 0: dev loss rose after its best: the
    run over-fits by the end of its budget). None without a curve."""
    if not curve:
        return None
    return 100.0 * (math.exp(curve[-1][1] - best_point(curve)[1]) - 1.0)
