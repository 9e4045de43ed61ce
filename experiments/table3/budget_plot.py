"""Dev curves of budget runs against target tokens seen: how the Table 3 budget was chosen.

    python -m experiments.table3.budget_plot --out=experiments/results/table3_small_budget \\
        LABEL=WORKDIR [LABEL=WORKDIR ...]

Writes <out>.png (dev perplexity against millions of target tokens, one line a run) and <out>.csv
(label, step, target tokens, dev NLL, dev PPL), from each run's metrics.jsonl and config.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os

from tfm_jax.viz.curves import read_metrics


def curve(workdir: str) -> tuple[int, list[dict]]:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        tokens = json.load(f)["data"]["tokens_per_batch"]
    evals = [r for r in read_metrics(workdir) if r.get("kind") == "eval"]
    return tokens, evals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.table3.budget_plot", description=__doc__
    )
    p.add_argument("runs", nargs="+", metavar="LABEL=WORKDIR")
    p.add_argument("--out", required=True, help="path without extension")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = []
    for spec in args.runs:
        label, _, workdir = spec.partition("=")
        tokens, evals = curve(workdir)
        xs = [r["step"] * tokens / 1e6 for r in evals]
        ax.plot(xs, [r["ppl"] for r in evals], marker=".", label=label)
        rows += [[label, r["step"], r["step"] * tokens, f"{r['nll']:.5f}", f"{r['ppl']:.4f}"]
                 for r in evals]  # fmt: skip
    ax.set(xlabel="target tokens seen (millions; padding-free budget)", ylabel="dev perplexity",
           yscale="log", title="Table 3 small preset: base row's dev curve")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    with open(args.out + ".csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "target_tokens_budget", "dev_nll", "dev_ppl"])
        w.writerows(rows)
    print(json.dumps({"png": args.out + ".png", "csv": args.out + ".csv", "evals": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
