"""Evidence for the Table 3 comparisons that did not come out as the paper's, computed from the
runs' dev curves: the report explains each from the data, never by hand.

For a comparison whose primary verdict is not "reproduced" or "tie as in the paper" this
computes, from the (row, seed) results' `dev_curve` ([step, dev NLL] at every evaluation):

- the seeds: every paired difference and whether they share a sign;
- the gap over training: the row's dev PPL over the reference's, in %, at each evaluation step
  both rows share, mean over the paired seeds. Its change from the middle of training to the end
  says whether the gap was closing toward the paper's direction when the budget ran out
  (budget-limited), moving away from it, or stable (a property of the scaled model);
- over-fitting and late learning: end vs best PPL and the late gain of both rows (stats.py).

`reading()` turns those numbers into one sentence by fixed thresholds (the protocol's minimum
effects), so the same runs always give the same explanation. `head_width_lines()` tabulates the
rows that differ from base only in heads and per-head width: the data behind the A and B rows.
Pure functions over numbers (tests/unit/test_table3_stats.py).
"""

from __future__ import annotations

import math

from experiments.table3 import stats

# A row is "still learning" when its late gain is this many nats above the reference's, and
# "over-fits" when its end-of-budget PPL is more than the PPL minimum effect above its best.
LATE_GAIN_MARGIN = 0.02
# The rows that differ from base only in heads and d_k / d_v (Table 3's A and B rows).
HEAD_ROWS = ("A1", "A4", "base", "A16", "A32", "B16", "B32")


def curve_gap(row_curve, ref_curve) -> dict[int, float]:
    """{step: 100 (PPL_row / PPL_ref - 1)} at the evaluation steps both curves have."""
    ref = {int(s): v for s, v in ref_curve}
    return {int(s): 100.0 * math.expm1(v - ref[int(s)]) for s, v in row_curve if int(s) in ref}


def gap_trajectory(row_runs: dict[int, list], ref_runs: dict[int, list]) -> list[tuple]:
    """[(step, mean gap %, n)] over the paired seeds, at the steps every paired seed shares."""
    seeds = sorted(set(row_runs) & set(ref_runs))
    gaps = [curve_gap(row_runs[s], ref_runs[s]) for s in seeds]
    if not gaps:
        return []
    steps = sorted(set.intersection(*(set(g) for g in gaps)))
    return [(step, sum(g[step] for g in gaps) / len(gaps), len(gaps)) for step in steps]


def trend(trajectory: list[tuple], expect: str | None) -> dict | None:
    """The gap at the shared step nearest half of the last one, at the last one, and which way
    it moved against the paper's expectation: "toward", "away" or "stable" (a change under the
    PPL minimum effect). For a tie, toward is toward 0."""
    if len(trajectory) < 2:
        return None
    last_step, end, _ = trajectory[-1]
    mid_step, mid, _ = min(trajectory[:-1], key=lambda t: abs(t[0] - last_step / 2))
    change = end - mid
    if abs(change) < stats.MIN_EFFECT["ppl"]:
        way = "stable"
    elif expect == "tie":
        way = "toward" if abs(end) < abs(mid) else "away"
    else:
        toward = change > 0 if expect == "worse" else change < 0
        way = "toward" if toward else "away"
    return {"mid_step": mid_step, "mid": mid, "end_step": last_step, "end": end, "way": way}


def beyond_reference(row_runs: list[dict], ref_runs: list[dict]) -> dict | None:
    """For a row trained longer than its reference (big: 3x base's steps), what its own longer
    budget did after the reference's last evaluation, over the paired seeds: the row's dev PPL at
    that step, its best and where, its end, and the reference's best (geometric means over
    seeds). Runs are results as the report reads them (report.at_best_checkpoint: `ppl`
    at the best checkpoint, `best_step`, `ppl_latest`). None when no paired row curve goes past
    the reference's end."""
    refs = {r.get("seed", 0): r for r in ref_runs if r.get("dev_curve")}
    items = []
    for run in row_runs:
        ref = refs.get(run.get("seed", 0))
        if ref is None or not run.get("dev_curve"):
            continue
        ref_end = max(int(step) for step, _ in ref["dev_curve"])
        row = [(int(step), v) for step, v in run["dev_curve"]]
        before = [v for step, v in row if step <= ref_end]
        if not before or row[-1][0] <= ref_end:
            continue
        items.append((ref_end, before[-1], math.log(run["ppl"]), run["best_step"],
                      math.log(run["ppl_latest"]), math.log(ref["ppl"])))  # fmt: skip
    if not items:
        return None
    mean = lambda i: sum(t[i] for t in items) / len(items)  # noqa: E731
    return {
        "ref_end": max(t[0] for t in items),
        "at_ref_end": math.exp(mean(1)),
        "best": math.exp(mean(2)),
        "best_step": max(t[3] for t in items),
        "end": math.exp(mean(4)),
        "ref_best": math.exp(mean(5)),
        "n": len(items),
    }


def diagnostics(summary: dict) -> dict:
    """A row's mean late gain (nats) and end over best (%), from its summary's per-run values
    (report.row_summaries)."""
    return {
        key: stats.mean_sd([v for v in summary[key] if v is not None])[0]
        for key in ("late_gain", "end_over_best")
    }


def reading(
    judgement: stats.Judgement,
    trend_: dict | None,
    row: dict,
    ref: dict,
    beyond: dict | None = None,
) -> str:
    """One sentence, by fixed thresholds, for why a comparison came out as it did. `beyond`
    (beyond_reference): the row had a longer budget than its reference, so the gap at shared
    steps says how it started, and its own later curve says what the longer budget bought."""
    overfit = stats.MIN_EFFECT["ppl"]
    row_rise, ref_rise = row.get("end_over_best") or 0.0, ref.get("end_over_best") or 0.0
    row_late, ref_late = row.get("late_gain") or 0.0, ref.get("late_gain") or 0.0
    if judgement.seeds and len(judgement.seeds) < 2:
        return "one seed: no noise estimate yet; the second seed decides"
    if row_rise > overfit and row_rise > ref_rise + overfit:
        return (
            f"over-fitting: the row's dev PPL rose {row_rise:.0f}% after its best (the "
            f"reference's {ref_rise:.0f}%): it over-fits within the budget (that the 29k pairs "
            "are why is an untested hypothesis unless the data experiment below tests it)"
        )
    if ref_rise > overfit and ref_rise > row_rise + overfit:
        return (
            f"the reference over-fits: its dev PPL rose {ref_rise:.0f}% after its best (the "
            f"row's {row_rise:.0f}%)"
        )
    if beyond is not None and judgement.verdict != stats.INCONCLUSIVE:
        gain = 100.0 * (1.0 - beyond["best"] / beyond["at_ref_end"])
        left = 100.0 * (beyond["best"] / beyond["ref_best"] - 1.0)
        if row_late > ref_late + LATE_GAIN_MARGIN:
            tail = (f"; it was still learning at the end of its own budget (late gain "
                    f"{row_late:.3f} nats, the reference's {ref_late:.3f})")  # fmt: skip
        else:
            tail = "; it had stopped learning (late gain within the margin of the reference's)"
        return (
            f"what the longer budget bought: at the reference's last step "
            f"({beyond['ref_end']}) the row's dev PPL was {beyond['at_ref_end']:.2f}; its later "
            f"steps took it {gain:.0f}% lower, to {beyond['best']:.2f} at step "
            f"{beyond['best_step']}, {left:+.1f}% against the reference's best "
            f"{beyond['ref_best']:.2f}{tail}"
        )
    if trend_ and trend_["way"] == "toward" and row_late > ref_late + LATE_GAIN_MARGIN:
        return (
            "budget-limited (as measured; more steps test it below): the gap was still closing "
            "toward the paper's when the budget ended "
            f"({trend_['mid']:+.1f}% at step {trend_['mid_step']} -> {trend_['end']:+.1f}% at "
            f"{trend_['end_step']}) and the row was still learning (late gain {row_late:.3f} "
            f"nats, the reference's {ref_late:.3f})"
        )
    if trend_ and trend_["way"] == "away":
        still = ""
        if row_late > ref_late + LATE_GAIN_MARGIN:
            still = (
                f"; the row was still learning faster (late gain {row_late:.3f} nats, the "
                f"reference's {ref_late:.3f})"
            )
        return (
            f"a growing difference: the gap moved away from the paper's over training "
            f"({trend_['mid']:+.1f}% at step {trend_['mid_step']} -> {trend_['end']:+.1f}% at "
            f"{trend_['end_step']}){still}; what a longer budget would do is untested here"
        )
    if judgement.verdict == stats.INCONCLUSIVE and judgement.mean is not None:
        if abs(judgement.mean) <= stats.MIN_EFFECT[judgement.metric]:
            return (
                "a small difference: the mean is inside the minimum effect but its noise band "
                "is wider than it; more seeds would narrow the band"
            )
        return "seed noise: the seeds' spread is too wide to call the difference"
    return (
        "a stable difference at this scale: the gap held over the second half of training "
        "and neither row over-fits; its cause is an untested hypothesis unless an "
        "explanation experiment below tests it"
    )


def evidence(comparison: stats.Comparison, judged: dict, summaries: dict) -> dict | None:
    """The evidence for one comparison whose primary verdict disagrees with the paper (None
    when it agrees or was not run). `summaries`: row -> its summary (row_summaries)."""
    j = judged[stats.PRIMARY]
    if j.verdict in (*stats.AGREES, stats.NOT_RUN):
        return None
    row, ref = summaries[comparison.row], summaries[comparison.ref]
    row_runs, ref_runs = row["runs"], ref["runs"]
    per_seed = {r.get("seed", 0): r["ppl"] for r in row_runs}
    ref_seed = {r.get("seed", 0): r["ppl"] for r in ref_runs}
    seeds, diffs = stats.paired("ppl", per_seed, ref_seed)
    curves = [{r.get("seed", 0): r.get("dev_curve") or [] for r in runs}
              for runs in (row_runs, ref_runs)]  # fmt: skip
    trajectory = gap_trajectory(*curves)
    t = trend(trajectory, comparison.expect[stats.PRIMARY])
    row_diag, ref_diag = diagnostics(row), diagnostics(ref)
    beyond = beyond_reference(row_runs, ref_runs)
    return {
        "comparison": comparison,
        "judgement": j,
        "bleu": judged[stats.SECONDARY],
        "seeds": seeds,
        "diffs": diffs,
        "same_sign": len({d > 0 for d in diffs}) == 1,
        "trajectory": trajectory,
        "trend": t,
        "row": row_diag,
        "ref": ref_diag,
        "beyond": beyond,
        "reading": reading(j, t, row_diag, ref_diag, beyond),
    }


def _f(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def evidence_lines(judged: list[dict], summaries: dict[str, dict]) -> list[str]:
    """The report's section on every comparison that did not come out as the paper's.
    `summaries`: row -> its summary (report.row_summaries: runs, means, diagnostics)."""
    items = [evidence(c, j, summaries) for c, j in zip(stats.PROTOCOL, judged, strict=True)]
    items = [e for e in items if e is not None]
    lines = [
        "## Why the others came out as they did (computed from the dev curves)",
        "",
        "For each comparison whose primary verdict is neither reproduced nor a tie: the paired "
        "per-seed PPL differences; the gap (the row's dev PPL over the reference's, mean over "
        "seeds) at each evaluation both rows share, so one sees whether it was closing toward "
        "the paper's direction when the budget ended; and both rows' late gain (nats of dev NLL "
        "won in the last 20% of the budget) and end vs best PPL (over-fitting). The reading "
        "states what the curves show, and names a cause only as an untested hypothesis (the "
        "explanation experiments below test them). It is "
        f"chosen by fixed thresholds: a gap change under {stats.MIN_EFFECT['ppl']:g}% is "
        f"stable; a late gain {LATE_GAIN_MARGIN:g} nats above the reference's is still "
        f"learning; an end-of-budget PPL over {stats.MIN_EFFECT['ppl']:g}% above the best is "
        "over-fitting.",
        "",
    ]
    if not items:
        return [*lines, "None so far.", ""]
    heads = head_width_rows(summaries)
    by_dk, by_h = head_width_correlations(heads) if len(heads) >= 3 else (None, None)
    for e in items:
        c, j = e["comparison"], e["judgement"]
        per_seed = ", ".join(f"{d:+.1f}%" for d in e["diffs"])
        sign = "same sign in every seed" if e["same_sign"] else "the seeds disagree in sign"
        gap = ", ".join(f"{step}: {g:+.1f}%" for step, g, _ in e["trajectory"])
        lines += [
            f"**{c.name}** ({c.claim}): {j.verdict}, expected {c.expect['ppl']}; dev BLEU "
            f"{e['bleu'].verdict}.",
            "",
            f"- Per seed ({', '.join(map(str, e['seeds']))}): {per_seed} ({sign}).",
            f"- Gap over training (step: row vs {c.ref}): {gap or '-'}.",
            f"- Late gain: row {_f(e['row']['late_gain'], '{:.3f}')}, {c.ref} "
            f"{_f(e['ref']['late_gain'], '{:.3f}')} nats; end vs best PPL: row "
            f"{_f(e['row']['end_over_best'], '{:+.1f}%')}, {c.ref} "
            f"{_f(e['ref']['end_over_best'], '{:+.1f}%')}.",
        ]
        if (b := e["beyond"]) is not None:
            lines.append(
                f"- Past {c.ref}'s budget (its last evaluation, step {b['ref_end']}): the row's "
                f"dev PPL {b['at_ref_end']:.2f} there, best {b['best']:.2f} at step "
                f"{b['best_step']}, end {b['end']:.2f}; {c.ref}'s best {b['ref_best']:.2f} "
                f"(means over {b['n']} seeds)."
            )
        lines += [f"- Reading: {e['reading']}."]
        if c.section in ("A", "B") and len(heads) >= 3:
            lines.append(
                f"- Across the {len(heads)} A and B rows run, dev PPL's rank correlation with "
                f"d_k is {_f(by_dk, '{:+.2f}')} and with h {_f(by_h, '{:+.2f}')} (the table "
                "under Rows)."
            )
        lines.append("")
    return lines


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under 3 points or no spread."""
    if len(xs) < 3:
        return None

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            k = i
            while k + 1 < len(order) and values[order[k + 1]] == values[order[i]]:
                k += 1
            for m in range(i, k + 1):
                out[order[m]] = (i + k) / 2
            i = k + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if not sxx or not syy:
        return None
    return sxy / math.sqrt(sxx * syy)


def head_width_rows(summaries: dict[str, dict]) -> list[tuple]:
    """(row, h, d_k, d_v, mean PPL, mean BLEU, runs) of the A and B rows run, by d_k."""
    rows = []
    for row in HEAD_ROWS:
        if row not in summaries:
            continue
        s = summaries[row]
        o = s["runs"][0]["overrides"]
        rows.append((row, o["model.num_heads"], o["model.d_k"], o["model.d_v"], s["ppl"][0],
                     s["bleu"][0], s["runs"]))  # fmt: skip
    return sorted(rows, key=lambda t: (-t[2], t[1]))


def head_width_correlations(rows: list[tuple]) -> tuple[float | None, float | None]:
    """Spearman's rank correlation of the rows' dev PPL with d_k, and with h."""
    ppls = [t[4] for t in rows]
    return (
        spearman([float(t[2]) for t in rows], ppls),
        spearman([float(t[1]) for t in rows], ppls),
    )


def head_width_lines(summaries: dict[str, dict]) -> list[str]:
    """The A and B rows (heads and per-head width only) by d_k, with PPL's rank correlation with
    d_k and with the number of heads: which of the two the scaled model's PPL follows."""
    rows = head_width_rows(summaries)
    if len(rows) < 3:
        return []
    by_dk, by_h = head_width_correlations(rows)
    lines = [
        "## Heads and per-head width (rows A and B)",
        "",
        "The rows that differ from base only in the number of heads h and the per-head widths "
        "d_k, d_v, by d_k (mean over seeds). At widths x 1/4, base's d_k is 16, the width the "
        "paper's B16 row shows to hurt; Spearman's rank correlation of dev PPL with d_k: "
        f"{_f(by_dk, '{:+.2f}')}, with h: {_f(by_h, '{:+.2f}')} ({len(rows)} rows; -1: PPL "
        "falls as it grows).",
        "",
        "| row | h | d_k | d_v | n | PPL (dev) | BLEU (dev) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, h, dk, dv, ppl, bleu, runs in rows:
        lines.append(f"| {row} | {h} | {dk} | {dv} | {len(runs)} | {ppl:.2f} | {bleu:.1f} |")
    return lines
