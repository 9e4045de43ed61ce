"""The Table 3 report: markdown and CSVs with the paper's numbers beside ours, the protocol's
verdicts, and a chart of each row's difference from base. Written by the sweep (sweep.py) from
the runs' result.json files; the statistics and the protocol are in stats.py.
"""

from __future__ import annotations

import collections
import csv
import math
import os

from experiments.table3 import stats
from experiments.table3.evidence import evidence_lines, head_width_lines
from experiments.table3.explain import explanation_lines
from experiments.table3.machines import check_lines
from experiments.table3.presets import TABLE3

SCALING = {
    "small": (
        "Scale (every row alike): the paper's row with d_model, d_ff, d_k and d_v x 1/4, layers "
        "x 1/2 (at least 1), heads, dropout and label smoothing unchanged; Multi30k EN-DE (29k "
        "pairs, dev = val), one 8k joint BPE shared by every run, packed batches of 8,192 "
        "target tokens (the paper: ~25k), bf16 compute with float32 weights; warmup 100 steps "
        "with lr_factor 0.5 (the d_model^-0.5 factor still differs between rows, as in the "
        "paper)."
    ),
    "paper": "Scale: the paper's rows as they are (WMT14 EN-DE, newstest2013 dev).",
    "micro": "Scale: a few steps of a tiny model; a smoke test of the harness, not a result.",
}

SCALING["gpu"] = SCALING["small"] + " Run on one GPU, several runs at once (preset `gpu`)."

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "steps")
KEYS = ("model.num_layers", "model.d_model", "model.d_ff", "model.num_heads", "model.d_k",
        "model.d_v", "model.dropout", "loss.label_smoothing", "train.num_steps")  # fmt: skip


def paper_value(row: str, metric: str) -> float:
    return getattr(TABLE3[row], metric)


def paper_gap(c: stats.Comparison, metric: str) -> float:
    return stats.difference(metric, paper_value(c.row, metric), paper_value(c.ref, metric))


def _fmt_gap(metric: str, value: float | None, spread: float | None = None) -> str:
    if value is None:
        return "-"
    unit = "%" if metric == "ppl" else ""
    text = f"{value:+.1f}{unit}" if metric == "ppl" else f"{value:+.2f}"
    if spread is not None:
        text += f" ± {spread:.1f}{unit}" if metric == "ppl" else f" ± {spread:.2f}"
    return text


def protocol_lines(seeds: list[int], steps: int, big: int) -> list[str]:
    """The pre-registered protocol, fixed before the runs: the report's header."""
    lines = [
        "## Protocol (fixed before the runs; experiments/table3/stats.py)",
        "",
        f"- Seeds: {', '.join(map(str, seeds))} for every row. train.seed draws the initial "
        "parameters, the dropout masks and the batch order; every row shares one vocabulary "
        "and the data settings, so seed K gives every row the same batches in the same order.",
        f"- Budget: every row {steps:,} steps of equal-token batches (the same token budget); "
        f"big {big:,} (3x, as in the paper).",
        "- Primary metric: dev perplexity at the best checkpoint, the lowest of the run's "
        "dev evaluations (every budget/10 steps, the end included; the end-of-budget value is "
        "in the seeds CSV). Secondary: dev BLEU (beam 4, alpha 0.6) at that same best "
        "checkpoint (runs from before the explanation sweep whose best was not their latest "
        "have the latest's BLEU, marked †). No checkpoint averaging.",
        "- A difference is paired per seed: PPL as 100 (PPL_row / PPL_ref - 1) %, BLEU in "
        "points. With n seeds and mean m it is real when n >= 2, |m| > t se and |m| > the "
        f"minimum effect ({stats.MIN_EFFECT['ppl']:g}% PPL, {stats.MIN_EFFECT['bleu']:g} BLEU), "
        "where se = s / sqrt(n) with s the paired differences' sd pooled over every comparison "
        "(each about its own mean) and t Student's 97.5% point on the pooled degrees of freedom "
        "(revised after the first sweep: its own-sd rule at n = 2 was t = 2 on 1 df, p ~ 0.3).",
        "- Verdicts. Strict (the paper finds the row better or worse): real in the paper's "
        "direction -> reproduced; real the other way -> reversed; else inconclusive (within "
        "noise). Tie: |m| + t se <= the minimum effect -> tie as in the paper; real -> not a "
        "tie (real difference); else inconclusive. One seed is always inconclusive.",
        f"- The paper's gaps were classed as: tie when |gap| <= {stats.PAPER_TIE['ppl']:g}% "
        f"PPL / {stats.PAPER_TIE['bleu']:g} BLEU, strict when >= "
        f"{stats.PAPER_STRICT['ppl']:g}% / {stats.PAPER_STRICT['bleu']:g}, not judged between.",
        "",
        "| # | section | comparison | claim | paper PPL | expected (PPL, primary) | "
        "paper BLEU | expected (BLEU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, c in enumerate(stats.PROTOCOL, 1):
        cells = [str(i), c.section, c.name, c.claim]
        for metric in stats.METRICS:
            ref, row = paper_value(c.ref, metric), paper_value(c.row, metric)
            digits = 2 if metric == "ppl" else 1
            gap = _fmt_gap(metric, paper_gap(c, metric))
            cells.append(f"{ref:.{digits}f} -> {row:.{digits}f} ({gap})")
            cells.append(c.expect[metric] or "not judged")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def noise_lines(results: list[dict]) -> list[str]:
    """The pooled noise behind every verdict, and what it lets the tie rule see."""
    noise = stats.protocol_noise(results)
    lines = ["## Noise (pooled over the comparisons)", ""]
    for metric, unit in (("ppl", "%"), ("bleu", " BLEU")):
        n = noise[metric]
        if n is None:
            lines.append(f"- {metric.upper()}: no comparison has two seeds yet.")
            continue
        floor = stats.MIN_EFFECT[metric]
        powers = ", ".join(f"n = {k}: {100 * stats.tie_power(n, k, floor):.0f}%" for k in (2, 3, 4))
        lines.append(
            f"- {'PPL' if metric == 'ppl' else 'BLEU'}: pooled sd {n.sd:.2f}{unit} on {n.df} df "
            f"({n.comparisons} comparisons), t = {n.multiple():.2f}; a difference is real past "
            f"{max(n.multiple() * n.se(2), floor):.2f}{unit} at n = 2 and "
            f"{max(n.multiple() * n.se(3), floor):.2f}{unit} at n = 3. The tie rule's power (a "
            f"true tie called a tie): {powers}; under the first protocol's own-sd rule it was "
            f"{100 * stats.own_sd_tie_power(2, floor, n.sd):.0f}% at n = 2. "
            + _half_power(n, floor)
        )
    return [*lines, ""]


def _half_power(noise: stats.Noise, floor: float) -> str:
    for k in range(2, 21):
        if stats.tie_power(noise, k, floor) >= 0.5:
            return f"It first reaches 50% at n = {k} seeds."
    return "It stays under 50% up to 20 seeds."


def at_best_checkpoint(result: dict) -> dict:
    """The primary metric, dev PPL at the best checkpoint: the lowest of the run's dev
    evaluations during training (every budget/10 steps, the end included; the same split and
    code as `evaluate`). "ppl_latest" keeps the end-of-budget value. BLEU is the best
    checkpoint's where the run evaluated it (runner.py since the explanation sweep) or where the
    best is the latest; else the latest's ("bleu_at": "latest")."""
    if "ppl_latest" in result or not result.get("dev_curve"):
        return result
    step, nll = stats.best_point(result["dev_curve"])
    return dict(
        result,
        ppl=math.exp(nll),
        ppl_latest=result["ppl"],
        best_step=int(step),
        bleu_at=stats.bleu_checkpoint(result),
    )


def refused_replays(results: list[dict]) -> str:
    """The dagger's runs whose replay (--bleu_at_best) was not the run, and by how much: made
    on other arithmetic or code, they keep the latest's BLEU."""
    said = [
        f"{_run_name(r)} ({r['replay_refused']['max_relative_ppl_difference']:.1e} at step "
        f"{r['replay_refused']['step']} on {r['replay_refused']['platform']})"
        for r in results
        if r.get("replay_refused") and r.get("bleu_at") == "latest"
    ]
    if not said:
        return ""
    return (
        " Replayed to their best step and not the run (dev PPL relative difference at the "
        "first evaluation that differed), so their dagger stays: " + ", ".join(said) + "."
    )


FEW_RUNS = 12  # a machine with at most this many runs has them named in the machines line


def machines_line(results: list[dict]) -> str:
    """Which machines trained the runs (a run's numbers depend on its arithmetic: bf16 products
    round differently on each), most runs first."""
    counts = collections.Counter(r.get("platform") for r in results)
    unknown = counts.pop(None, 0)
    parts = [f"{n} on {name}" for name, n in counts.most_common()]
    for i, (name, n) in enumerate(counts.most_common()[1:], 1):
        if n <= FEW_RUNS:  # the few on another machine by name: a pair with one is mixed
            runs = (r for r in results if r.get("platform") == name)
            parts[i] += " (" + ", ".join(_run_name(r) for r in runs) + ")"
    if unknown:
        parts.append(f"{unknown} not recorded (made before results recorded their machine)")
    line = f"Machines, {len(results)} runs: " + "; ".join(parts) + "."
    if len(counts) > 1:
        line += (
            " A pair across machines (one run of it named above) differs by its machine's "
            "arithmetic as well as by its row: its runs are not the same trajectory but for the "
            "row's change."
        )
    return line


def _run_name(r: dict) -> str:
    return stats.run_name(r.get("variant"), r["row"], r.get("seed", 0))


def row_summaries(results: list[dict], rows: list[str]) -> list[dict]:
    """Per row: the runs (by seed), mean and sd of PPL and BLEU, and each run's dev-curve
    diagnostics (late gain, end over best)."""
    out = []
    for row in rows:
        runs = sorted((r for r in results if r["row"] == row), key=lambda r: r.get("seed", 0))
        if not runs:
            continue
        s = {"row": row, "runs": runs, "seeds": [r.get("seed", 0) for r in runs]}
        curves = [r.get("dev_curve") or [] for r in runs]  # per run, in the runs' order
        s["late_gain"] = [stats.late_gain(c) for c in curves]
        s["end_over_best"] = [stats.end_over_best(c) for c in curves]
        for metric in stats.METRICS:
            s[metric] = stats.mean_sd([r[metric] for r in runs])
        out.append(s)
    return out


def _mean_of(values: list[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    return fmt.format(sum(known) / len(known)) if known else "-"


def _pm(mean_sd: tuple, digits: int) -> str:
    mean, sd = mean_sd
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def write_table(
    preset: str,
    results: list[dict],
    out_dir: str,
    command: str,
    seeds: list[int],
    steps: int,
    big_steps: int,
    checks: list[dict] = (),
) -> list[str]:
    """Markdown + CSVs with the paper's numbers beside ours, the verdicts, and a chart.
    `steps` and `big_steps`: the budget of base (and every row) and of big; `checks`: the
    machine checks (machines.py), listed after the machines line."""
    os.makedirs(out_dir, exist_ok=True)
    everything = [at_best_checkpoint(r) for r in results]
    results = [r for r in everything if not r.get("variant")]  # the sweep's own protocol
    stem = os.path.join(out_dir, f"table3_{preset}")
    rows = row_summaries(results, list(TABLE3))
    header = ["row", *COLUMNS, "seeds", "PPL (dev)", "PPL sd", "BLEU (dev)", "BLEU sd",
              "params (M)", "paper PPL", "paper BLEU", "paper params (M)"]  # fmt: skip
    csv_rows, md_rows = [], []
    for s in rows:
        paper, o = TABLE3[s["row"]], s["runs"][0]["overrides"]
        (ppl, ppl_sd), (bleu, bleu_sd) = s["ppl"], s["bleu"]
        plateaus = [r.get("plateau_step") for r in s["runs"]]
        settings = [o[k] for k in KEYS]
        paper_params = paper.params_millions if paper.params_millions is not None else ""
        paper_cols = [paper.ppl, paper.bleu, paper_params]
        csv_rows.append([
            s["row"], *settings, " ".join(map(str, s["seeds"])), f"{ppl:.3f}",
            "" if ppl_sd is None else f"{ppl_sd:.3f}", f"{bleu:.2f}",
            "" if bleu_sd is None else f"{bleu_sd:.2f}", f"{s['runs'][0]['params'] / 1e6:.2f}",
            *paper_cols,
        ])  # fmt: skip
        md_rows.append([
            s["row"], *settings, len(s["runs"]), _pm(s["ppl"], 2), _pm(s["bleu"], 1),
            " / ".join("-" if p is None else str(p) for p in plateaus),
            _mean_of(s["late_gain"], "{:.3f}"), _mean_of(s["end_over_best"], "{:+.1f}%"),
            f"{s['runs'][0]['params'] / 1e6:.2f}", *paper_cols,
        ])  # fmt: skip
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(csv_rows)
    with open(stem + "_seeds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "seed", "ppl", "best_step", "ppl_latest", "bleu", "bleu_tok_compound",
                    "params", "plateau_step", "late_gain_nats", "end_over_best_pct",
                    "train_seconds", "eval_seconds", "platform"])  # fmt: skip
        for s in rows:
            for r, gain, rise in zip(s["runs"], s["late_gain"], s["end_over_best"], strict=True):
                w.writerow([r["row"], r.get("seed", 0), r["ppl"], r.get("best_step"),
                            r.get("ppl_latest"), r["bleu"], r.get("bleu_tok_compound"),
                            r["params"], r.get("plateau_step"), gain, rise,
                            r.get("train_seconds"), r.get("eval_seconds"),
                            r.get("platform")])  # fmt: skip

    md_header = ["row", *COLUMNS, "n", "PPL (dev)", "BLEU (dev)", "plateau step",
                 "late gain (nats)", "end vs best PPL", "params (M)", "paper PPL", "paper BLEU",
                 "paper params (M)"]  # fmt: skip
    judged = stats.judge_protocol(results)
    lines = [
        f"# Table 3 reproduction, preset `{preset}`",
        "",
        f"Command: `{command}`",
        "",
        "Ours: dev perplexity per wordpiece and dev sacreBLEU (beam 4, alpha 0.6, no checkpoint "
        "averaging), mean ± sd over seeds. Paper: newstest2013 at full scale, one run a row "
        "(../shared/PAPER.md).",
        "",
        SCALING[preset],
        "",
        *protocol_lines(seeds, steps, big_steps),
        "",
        "## Verdicts",
        "",
        f"**{stats.summary_line(judged)}** (dev PPL, the primary metric).",
        "",
        f"Dev BLEU (secondary): {stats.summary_line(judged, 'bleu')}.",
        "",
        "Ours: mean ± this comparison's own sd over its n seeds; real past the threshold "
        "(the pooled t se, at least the minimum effect). †: a run's BLEU is its latest "
        "checkpoint's, not its best's." + refused_replays(results),
        "",
        "| # | comparison | expected PPL | ours: PPL diff (mean ± sd, n) | real past | verdict "
        "(PPL) | expected BLEU | ours: BLEU diff | real past | verdict (BLEU) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    latest_bleu = {(r["row"], r.get("seed", 0)) for r in results if r.get("bleu_at") == "latest"}
    for i, (c, j) in enumerate(zip(stats.PROTOCOL, judged, strict=True), 1):
        cells = [str(i), c.name]
        for metric in stats.METRICS:
            jm = j[metric]
            n = f", n={len(jm.seeds)}" if jm.seeds else ""
            dagger = any((r, s) in latest_bleu for r in (c.row, c.ref) for s in jm.seeds)
            mark = " †" if metric == "bleu" and dagger else ""
            expected = c.expect[metric] or "not judged"
            cells += [f"{expected} ({_fmt_gap(metric, paper_gap(c, metric))})",
                      _fmt_gap(metric, jm.mean, jm.sd) + n + mark,
                      _fmt_gap(metric, jm.threshold).lstrip("+"), jm.verdict]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    by_row = {s["row"]: s for s in rows}
    disagree = [c.row for c, j in zip(stats.PROTOCOL, judged, strict=True)
                if j[stats.PRIMARY].verdict not in stats.AGREES]  # fmt: skip
    noise = stats.protocol_noise(results)[stats.PRIMARY]
    lines += ["", *noise_lines(results), *evidence_lines(judged, by_row)]
    lines += explanation_lines(everything, noise, disagree)
    lines += [
        "## Rows",
        "",
        "Plateau step: per seed, the first dev evaluation after which dev NLL never improved by "
        "more than 0.01 nats (- : not reached, or too few evaluations; see --eval_every). "
        "Late gain: how much dev NLL still fell over the last 20% of the budget, mean over "
        "seeds (well above base's: the row was still learning when it was judged, so a row "
        "that trains slower than base is judged early). End vs best PPL: the end-of-budget dev "
        "PPL over the best evaluation's, mean over seeds (above 0: dev loss rose after its best, "
        "the row over-fits within the budget).",
        "",
        machines_line(everything),
        "",
        *check_lines(list(checks), everything),
        "| " + " | ".join(md_header) + " |",
        "|" + "---|" * len(md_header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in md_rows),
    ]
    head_widths = head_width_lines(by_row)
    if head_widths:
        lines += ["", *head_widths]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    written = [stem + ".md", stem + ".csv", stem + "_seeds.csv"]
    try:
        written.append(plot_chart(results, stem + ".png"))
    except ImportError:
        pass
    return written


def chart_data(results: list[dict]) -> list[dict]:
    """Per row other than base (by section): our paired differences from base and the paper's."""
    tables = {m: stats.by_row_seed(results, m) for m in stats.METRICS}
    out = []
    for row in TABLE3:
        if row == "base" or row not in tables["ppl"]:
            continue
        entry = {"row": row, "section": stats.section_of(row)}
        for metric in stats.METRICS:
            seeds, diffs = stats.paired(metric, tables[metric][row], tables[metric].get("base", {}))
            mean, sd = stats.mean_sd(diffs)
            se = None if sd is None else sd / len(diffs) ** 0.5
            entry[metric] = {
                "ours": mean,
                "band": None if se is None else stats.SE_MULTIPLE * se,
                "paper": stats.difference(
                    metric, paper_value(row, metric), paper_value("base", metric)
                ),
            }
        out.append(entry)
    return out


def plot_chart(results: list[dict], path: str) -> str:
    """Each row's difference from base, ours (± 2 se over seeds) beside the paper's, by section."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = chart_data(results)
    xs, x, last = [], 0.0, None
    for d in data:  # a gap between the paper's sections
        x += 1.0 if last in (None, d["section"]) else 1.8
        xs.append(x)
        last = d["section"]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(data) + 3), 8), sharex=True)
    width = 0.38
    panels = (
        ("ppl", "dev PPL vs base (%)\n(lower is better)"),
        ("bleu", "dev BLEU vs base (points)\n(higher is better)"),
    )
    for ax, (metric, label) in zip(axes, panels, strict=True):
        ours = [d[metric]["ours"] if d[metric]["ours"] is not None else float("nan") for d in data]
        band = [d[metric]["band"] or 0.0 for d in data]
        paper = [d[metric]["paper"] for d in data]
        ours_label = f"ours (mean over seeds, ± {stats.SE_MULTIPLE:g} se; hatched: one seed)"
        left, right = [v - width / 2 for v in xs], [v + width / 2 for v in xs]
        bars = ax.bar(left, ours, width, yerr=band, capsize=3, color="tab:blue", label=ours_label)
        for bar, d in zip(bars, data, strict=True):
            if d[metric]["band"] is None:  # no spread to show
                bar.set_hatch("//")
        ax.bar(right, paper, width, color="tab:orange", label="paper (one run, full scale)")
        ax.axhline(0.0, color="black", lw=0.8)
        for sign in (-1, 1):
            ax.axhline(sign * stats.MIN_EFFECT[metric], color="grey", lw=0.8, ls=":")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    sections: dict[str, list[float]] = {}
    for d, v in zip(data, xs, strict=True):
        sections.setdefault(d["section"], []).append(v)
    for name, where in sections.items():
        axes[0].annotate(
            name, (sum(where) / len(where), 1.0), xycoords=("data", "axes fraction"),
            ha="center", va="bottom", fontweight="bold",
        )  # fmt: skip
    axes[1].set_xticks(xs)
    axes[1].set_xticklabels([d["row"] for d in data], rotation=45)
    fig.suptitle("Table 3: each row's difference from base (dotted: the minimum effect)", y=0.99)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
