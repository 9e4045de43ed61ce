"""The explanation experiments' verdict rules as code (explain.py registers the experiments):
each reads the finished runs' dev curves (dev PPL at the best checkpoint, paired per seed) and
says "supported", "refuted", "inconclusive" or, for a rule in EARLY still missing runs,
"pending", with the numbers it used. Pure functions over results."""

from __future__ import annotations

import math

from experiments.table3 import stats
from experiments.table3.presets import TABLE3, step_multiple

SUPPORTED, REFUTED, INCONCLUSIVE, PENDING = "supported", "refuted", "inconclusive", "pending"
FLOOR = stats.MIN_EFFECT["ppl"]  # 2% of the reference's dev PPL
SEEDS = (0, 1)  # the main sweep's seeds, which every experiment compares with


# ---- reading the runs ----


def best_ppl(result: dict, upto: int | None = None) -> float:
    """Dev PPL at the best evaluation (at or before step `upto`)."""
    return math.exp(stats.best_point(result["dev_curve"], upto)[1])


def _table(results: list[dict], variant: str | None, upto: int | None = None) -> dict:
    """{row: {seed: best dev PPL}} of one variant's runs (None: the main sweep), at or before
    base's step `upto` (a row's own: `upto` x its steps over base's, big 3x)."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r.get("variant") == variant and r.get("dev_curve"):
            cut = upto * step_multiple(r["row"]) if upto else None
            out.setdefault(r["row"], {})[int(r["seed"])] = best_ppl(r, cut)
    return out


def gap(table: dict, row: str, ref: str, seeds=None) -> tuple[list[int], list[float]]:
    """Paired PPL differences (%) of row vs ref over the seeds both have (or `seeds`)."""
    s, d = stats.paired("ppl", table.get(row, {}), table.get(ref, {}))
    if seeds is not None:
        d = [x for x, k in zip(d, s, strict=True) if k in seeds]
        s = [k for k in s if k in seeds]
    return s, d


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def paper_gap(row: str, ref: str) -> float:
    return stats.difference("ppl", TABLE3[row].ppl, TABLE3[ref].ppl)


def _ref_of(row: str) -> str:
    return next(c.ref for c in stats.PROTOCOL if c.row == row)


def _pair(table: dict, row: str, ref: str, seeds: tuple[int, ...], noise):
    """(the pair's judgement, its per-seed differences) over `seeds`, or None while a run of it
    is missing."""
    s, d = gap(table, row, ref, seeds)
    return (_real(d, noise), d) if len(s) == len(seeds) else None


def _e(results, noise):
    main = _table(results, None)
    _, g_e = gap(main, "E", "base", SEEDS)
    _, g_s = gap(main, "E-std1", "base", SEEDS)
    m_e, m_s = _mean(g_e), _mean(g_s)
    drop = m_e - m_s
    if drop > FLOOR and abs(m_s) <= abs(m_e) / 2:
        verdict = SUPPORTED
    elif drop < FLOOR / 2:
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    return {
        "outcome": verdict,
        "details": [
            f"E vs base {m_e:+.1f}%, E-std1 vs base {m_s:+.1f}% (seeds 0, 1): the gap fell "
            f"{drop:+.1f} points"
        ],
    }


def _real(diffs: list[float], noise: stats.Noise | None) -> stats.Judgement:
    return stats.judge("ppl", "tie", diffs, noise=noise)


def _heads(results, noise):
    main = _table(results, None)
    same_dk = (("H1K64", "base"), ("H16K64", "base"), ("H8K128", "A4"), ("H8K32", "A16"))
    same_h = (("H8K128", "base", "better"), ("H8K32", "base", "worse"))
    lines, real_same_dk, wrong_way, right_way, open_pairs = [], 0, 0, 0, 0
    for row, ref, expect in [(row, ref, None) for row, ref in same_dk] + list(same_h):
        kind = "same d_k, other h" if expect is None else "same h = 8, other d_k"
        pair = _pair(main, row, ref, SEEDS, noise)
        if pair is None:
            open_pairs += 1
            lines.append(f"{kind}: {row} vs {ref} (runs to come)")
            continue
        j, diffs = pair
        note = "real" if j.real else "not real"
        if expect is None:
            real_same_dk += j.real
        else:
            way = stats.direction("ppl", j.mean)
            right_way += j.real and way == expect
            wrong_way += j.real and way != expect
            note = f"{note + ', ' + way if j.real else note}; predicted {expect}"
        per_seed = ", ".join(f"{d:+.1f}%" for d in diffs)  # the spread beside the verdict
        lines.append(f"{kind}: {row} vs {ref} {j.mean:+.1f}% (seeds {per_seed}; {note})")
    if real_same_dk >= 2 or wrong_way:  # more pairs cannot undo it
        verdict = REFUTED
    elif open_pairs:
        verdict = PENDING
    elif real_same_dk == 0 and right_way == len(same_h):
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    return {"outcome": verdict, "details": lines}


def _seed3(results, noise):
    main = _table(results, None)
    lines, refuted, held, open_pairs, by_row = [], 0, 0, 0, {}
    cases = [("Cff4096", "not real")] + [(r, "real") for r in ("A16", "C8", "D0.2", "E")]
    for row, predicted in cases:
        ref = _ref_of(row)
        j2 = _real(gap(main, row, ref, SEEDS)[1], noise)
        pair = _pair(main, row, ref, (0, 1, 2), noise)
        if pair is None:
            open_pairs += 1
            lines.append(f"{row} vs {ref}: 2 seeds {j2.mean:+.1f}%, seed 2 to come")
            continue
        j3 = pair[0]
        if predicted == "not real":
            ok, bad = not j3.real, j3.real
        else:
            ok = j3.real and (j3.mean > 0) == (j2.mean > 0)
            bad = not j3.real and abs(j3.mean) < FLOOR
        held += ok
        refuted += bad
        by_row[row] = SUPPORTED if ok else REFUTED if bad else INCONCLUSIVE
        lines.append(
            f"{row} vs {ref}: 2 seeds {j2.mean:+.1f}%, 3 seeds {j3.mean:+.1f}% "
            f"({'real' if j3.real else 'not real'}; predicted {predicted})"
        )
    _, g = gap(main, "C1024", "base", (0, 1, 2))
    j = _real(g, noise)
    if len(g) == 3:
        by_row["C1024"] = "no prediction"
    lines.append(
        f"C1024 vs base (its verdict, no prediction): {j.mean:+.1f}% over {len(g)} seeds "
        f"({'real' if j.real else 'not real'})"
    )
    if refuted:  # any one case refutes: more cases cannot undo it
        verdict = REFUTED
    elif open_pairs:
        verdict = PENDING
    else:
        verdict = SUPPORTED if held == len(cases) else INCONCLUSIVE
    return {"outcome": verdict, "details": lines, "by_row": by_row}


BUDGET_ROWS = ("C8", "Cff4096", "big")  # big against base's 2,400 steps at its own 3x


def _budget(results, noise):
    long = _table(results, "s2400")
    first = _table(results, "s2400", upto=1200)
    lines, by_row = [], {}
    for row in BUDGET_ROWS:
        ref, k = _ref_of(row), step_multiple(row)
        target = paper_gap(row, ref)
        pairs = [_pair(t, row, ref, SEEDS, None) for t in (first, long)]
        if None in pairs:  # its runs or its reference's are still to come
            lines.append(f"{row} vs {ref}: (runs to come)")
            continue
        g1, g2 = (p[0].mean for p in pairs)
        nearer = abs(g1 - target) - abs(g2 - target)
        by_row[row] = _moved(nearer)
        lines.append(
            f"{row} vs {ref}: best of {1200 * k:,} steps {g1:+.1f}%, of {2400 * k:,} {g2:+.1f}% "
            f"(the paper {target:+.1f}%): {nearer:+.1f} points nearer: {by_row[row]}"
        )
    return _verdict(by_row, BUDGET_ROWS, lines)


def _data(results, noise):
    tables = [_table(results, v) for v in (None, "f50", "f25")]
    base = [[t.get("base", {}).get(s) for s in SEEDS] for t in tables]  # what the gaps are of
    shown = " / ".join("(to come)" if None in b else f"{_mean(b):.2f}" for b in base)
    lines, by_row = [f"base's own dev PPL on 100% / 50% / 25% of the pairs: {shown}"], {}
    for row in ("D0.2", "Dls0.0", "C1024"):
        target = paper_gap(row, "base")
        pairs = [_pair(t, row, "base", SEEDS, None) for t in tables]
        shown = " / ".join("(to come)" if p is None else f"{p[0].mean:+.1f}%" for p in pairs)
        line = f"{row} vs base on 100% / 50% / 25% of the pairs: {shown} (the paper {target:+.1f}%)"
        if None in pairs:
            lines.append(line)
            continue
        away = [abs(p[0].mean - target) for p in pairs]
        further = away[2] - away[0]
        by_row[row] = _moved(further)
        if by_row[row] == SUPPORTED and away[1] < away[0] - FLOOR / 2:
            by_row[row] = INCONCLUSIVE  # further on 25% but nearer on 50%: no trend
        lines.append(f"{line}: {by_row[row]}")
    return _verdict(by_row, ("D0.2", "Dls0.0", "C1024"), lines)


def _moved(points: float) -> str:
    """Moved toward what the explanation predicts by `points`: past FLOOR supports it, under
    half of FLOOR refutes it, in between neither."""
    return SUPPORTED if points > FLOOR else REFUTED if points < FLOOR / 2 else INCONCLUSIVE


def _verdict(by_row: dict[str, str], rows: tuple[str, ...], lines: list[str]) -> dict:
    """The experiment's outcome from its comparisons' own verdicts (each in by_row, which the
    report lists per comparison): the one they share if they agree, else "mixed", naming
    each; pending while a comparison's runs are missing."""
    verdicts = [by_row.get(row) for row in rows]
    if None in verdicts:
        outcome = PENDING
    elif len(set(verdicts)) == 1:
        outcome = verdicts[0]
    else:
        outcome = "mixed: " + ", ".join(f"{row} {by_row[row]}" for row in rows)
    return {"outcome": outcome, "details": lines, "by_row": by_row}


RULES = {"E": _e, "heads": _heads, "seed3": _seed3, "budget": _budget, "data": _data}
# the rules that refute on any one complete pair, whatever the others show: outcome() may
# decide them "refuted" before every run has finished (never "supported")
EARLY = ("heads", "seed3")
# the rules that also read a sweep still running, for the report's "so far" lines (their
# outcome then is "pending", whatever they say, unless EARLY)
SO_FAR = (*EARLY, "budget", "data")
