"""The pre-registered explanation experiments: for each Table 3 comparison the first sweep did
not reproduce, an experiment that could refute the explanation the report gave, written here
(and into the report) before any of its runs, with its prediction and its verdict rule as code.

Each experiment names its runs as (variant, row, seeds). A variant is the sweep's protocol with
one thing changed (presets.VARIANTS: the budget, the share of the training pairs); it runs under
<root>/variants/<name>/ROW/seedK/ with the main sweep's vocabulary, so seed K still gives every
row the same batches. Probe rows (H1K64, E-std1, ...) are rows of configs/table3.py:PROBES.

    python -m experiments.table3 --explain=all          # every experiment's runs, in order
    python -m experiments.table3 --explain=heads,E      # some of them

`outcome()` reads the finished runs and says "supported", "refuted", "inconclusive" or
"pending" (runs missing), with the numbers it used, by each experiment's rule in rules.py. Pure
functions over results (tests/unit/test_table3_stats.py).
"""

from __future__ import annotations

import dataclasses

from experiments.table3 import stats
from experiments.table3.presets import VARIANTS
from experiments.table3.rules import EARLY, FLOOR, PENDING, REFUTED, RULES, SEEDS, SO_FAR


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    comparisons: tuple[str, ...]  # the rows whose comparison it explains (stats.PROTOCOL)
    hypothesis: str
    runs: tuple[tuple[str | None, tuple[str, ...], tuple[int, ...]], ...]  # (variant, rows, seeds)
    prediction: str
    refuted_if: str
    # the main sweep's rows (seeds 0, 1) its rule compares its runs with: it is judged once
    # they are finished too (a sweep running beside it may not have finished them yet)
    reads: tuple[str, ...] = ()


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(
        "E",
        ("E",),
        "E's learned table starts at std 0.02 while the scaled token embeddings start at std 1, "
        "so positions are ~50x weaker than tokens at the start: the gap to sinusoids is the "
        "initial scale, not learned positions as such",
        ((None, ("E-std1",), SEEDS),),
        "E-std1 (the learned table at std 1) vs base: the mean gap falls by more than "
        f"{FLOOR:g} points from E's and to at most half of E's",
        f"the gap falls by less than {FLOOR / 2:g} points from E's",
        reads=("base", "E"),
    ),
    Experiment(
        "heads",
        ("A1", "A16"),
        "dev PPL follows the per-head width d_k, not the number of heads h (within row A, h x "
        "d_k is fixed, so the first sweep could not separate them)",
        ((None, ("H1K64", "H16K64", "H8K128", "H8K32"), SEEDS),),
        "at the same d_k, a different h makes no real difference (H1K64 and H16K64 vs base, "
        "H8K128 vs A4, H8K32 vs A16: none real), and at the same h = 8 d_k does (H8K128 "
        "better than base, H8K32 worse, both real)",
        "two or more of the four same-d_k pairs differ really, or a same-h pair differs really "
        "the other way",
        reads=("base", "A4", "A16"),
    ),
    Experiment(
        "seed3",
        ("A16", "C8", "C1024", "Cff4096", "D0.2", "E"),
        "the two-seed verdicts are the rows', not seed noise: Cff4096's seeds disagree in sign "
        "(no real d_ff effect at this scale), the ties' real differences stay real",
        ((None, ("base", "Cff1024", "Cff4096", "C1024", "A16", "C8", "D0.2", "E"), (2,)),),
        "with seed 2 (pooled noise): Cff4096 vs Cff1024 still not real; A16, C8, D0.2 and E "
        "still real, in the same direction",
        "Cff4096 becomes real, or a tie comparison's difference stops being real with its "
        f"mean inside {FLOOR:g}%",
        reads=("base", "Cff1024", "Cff4096", "C1024", "A16", "C8", "D0.2", "E"),
    ),
    Experiment(
        "budget",
        ("C8", "Cff4096", "big"),
        "budget-limited: the rows whose gap was still closing toward the paper's when their "
        "budget ended (C8, Cff4096 at step 1,200; big at its 3,600, added on its first seed, "
        "before any budget run) need more steps; the paper's gap is approached with twice the "
        "budget",
        (("s2400", ("base", "C8", "Cff1024", "Cff4096", "big"), SEEDS),),
        "at the best checkpoint of twice the budget (2,400 steps; big 7,200 against base's "
        f"2,400) the gap is more than {FLOOR:g} points nearer the paper's than at the best of "
        "the first budget (1,200; big 3,600)",
        f"it comes less than {FLOOR / 2:g} points nearer (or moves away)",
    ),
    Experiment(
        "data",
        ("D0.2", "Dls0.0", "C1024"),
        "small data: on 29k pairs more dropout helps (D0.2), no label smoothing and a wider "
        "model over-fit (Dls0.0, C1024), so the gaps are Multi30k's size, not the rows'",
        (
            ("f50", ("base", "D0.2", "Dls0.0", "C1024"), SEEDS),
            ("f25", ("base", "D0.2", "Dls0.0", "C1024"), SEEDS),
        ),
        f"on 25% of the pairs each gap is more than {FLOOR:g} points further from the paper's "
        f"than on all of them, and the 50% gap is not nearer than all's by more than "
        f"{FLOOR / 2:g}",
        f"on 25% the gap is less than {FLOOR / 2:g} points further from the paper's (or nearer)",
        reads=("base", "D0.2", "Dls0.0", "C1024"),
    ),
)
BY_NAME = {e.name: e for e in EXPERIMENTS}


def experiments_for(comparison_row: str) -> list[Experiment]:
    return [e for e in EXPERIMENTS if comparison_row in e.comparisons]


def run_list(names: list[str]) -> list[tuple[str | None, str, int]]:
    """(variant, row, seed) of the named experiments' runs, in order, each once: row by row,
    each row in every variant, so that a sweep cut short has whole comparisons (data judges a
    row once it ran on 50% and on 25% of the pairs), not one variant of each."""
    out: list[tuple[str | None, str, int]] = []
    for name in names:
        groups = BY_NAME[name].runs
        for row in dict.fromkeys(row for _, rows, _ in groups for row in rows):
            for variant, rows, seeds in groups:
                for seed in seeds if row in rows else ():
                    if (variant, row, seed) not in out:
                        out.append((variant, row, seed))
    return out


def _missing(results: list[dict], need: list[tuple[str | None, str, int]]) -> list[str]:
    have = {(r.get("variant"), r["row"], int(r["seed"])) for r in results}
    return [stats.run_name(v, row, s) for v, row, s in need if (v, row, s) not in have]


def outcome(experiment: Experiment, results: list[dict], noise: stats.Noise | None) -> dict:
    """{"outcome": supported | refuted | inconclusive | mixed: ... | pending, "details": [lines],
    "by_row": {comparison row: its own verdict}, where the rule judges each}. Pending while
    runs are missing (with the rule's lines "so far", SO_FAR), except that a rule which refutes
    on any one complete pair (EARLY) is "refuted" as soon as the complete pairs meet it: none
    of its own runs to come can undo that (the pooled noise, from the sweep's runs, still
    can)."""
    need = run_list([experiment.name])
    missing = _missing(results, need)
    reads = [(None, row, s) for row in experiment.reads for s in SEEDS]
    unread = _missing(results, reads)
    if missing:
        head = f"{len(need) - len(missing)} of {len(need)} runs finished"
        # read so far only where every run it compares with has its dev curve
        curves = [r for r in results if r.get("dev_curve")]
        readable = experiment.name in SO_FAR and not _missing(curves, reads)
        partial = RULES[experiment.name] if readable else None
        so_far = partial(results, noise) if partial else {"outcome": PENDING, "details": []}
        if so_far["outcome"] == REFUTED and experiment.name in EARLY:
            return {
                "outcome": REFUTED,
                "details": [
                    f"decided early, with {head}: the complete pairs already meet the "
                    f"refutation rule, which its runs to come ({', '.join(missing)}) cannot undo "
                    "(a change in the pooled noise could, as it could any verdict here)",
                    *so_far["details"],
                ],
                **_by_row(so_far),
            }
        lines = [f"so far, {d}" for d in so_far["details"]]
        details = [f"{head}; to run: {', '.join(missing)}", *lines]
        # a comparison whose own runs are all in has its verdict (where the rule judges each)
        return {"outcome": PENDING, "details": details, **_by_row(so_far)}
    if unread:
        return {
            "outcome": PENDING,
            "details": [f"its runs are finished; the sweep's to finish: {', '.join(unread)}"],
        }
    return RULES[experiment.name](results, noise)


def _by_row(judged: dict) -> dict:
    """The rule's per-comparison verdicts, where it judges each (else nothing)."""
    return {"by_row": judged["by_row"]} if "by_row" in judged else {}


def _verdict_for(experiment: Experiment, row: str, results: list[dict], noise) -> str:
    """The experiment's verdict on one comparison: where the rule judges each, that
    comparison's own (pending until its pairs are in), else the experiment's."""
    o = outcome(experiment, results, noise)
    return o["by_row"].get(row, PENDING) if "by_row" in o else o["outcome"]


def explanation_lines(
    results: list[dict], noise: stats.Noise | None, disagreeing: list[str]
) -> list[str]:
    """The report's section: each experiment as registered, and its outcome so far; then, for
    every comparison that is not reproduced or tied, the experiments that test it."""
    lines = [
        "## Explanation experiments (pre-registered; experiments/table3/explain.py)",
        "",
        "Written before their runs, with the prediction and the rule that refutes it; each "
        "outcome is computed from the runs by that rule (dev PPL at the best checkpoint, paired "
        "per seed). Where an explanation is refuted, the report says so.",
        "",
    ]
    for e in EXPERIMENTS:
        o = outcome(e, results, noise)
        runs = "; ".join(
            f"{(VARIANTS[v].about + ': ') if v else ''}{', '.join(rows)} x seeds "
            f"{', '.join(map(str, seeds))}"
            for v, rows, seeds in e.runs
        )
        lines += [
            f"**{e.name}** (explains {', '.join(e.comparisons)}): **{o['outcome']}**.",
            "",
            f"- Hypothesis: {e.hypothesis}.",
            f"- Runs: {runs}.",
            f"- Prediction: {e.prediction}. Refuted if {e.refuted_if}.",
            *(f"- {d}." for d in o["details"]),
            "",
        ]
    lines += ["Comparisons not reproduced or tied, and what tests them:", ""]
    for row in disagreeing:
        tested = [
            f"{e.name} ({_verdict_for(e, row, results, noise)})" for e in experiments_for(row)
        ]
        if row == "big" and not any(r["row"] == "big" and not r.get("variant") for r in results):
            tested = [
                "not run yet: the sweep's own row (3x steps), nothing to explain until it runs"
            ]
        lines.append(f"- {row}: {', '.join(tested) if tested else 'no experiment (untested)'}")
    return [*lines, ""]
