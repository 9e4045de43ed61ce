"""Machine checks: how far a run moves when another machine trains it.

A run is a function of its settings and of the machine's arithmetic (bf16 products round
otherwise where the CPU has no bf16), so a pair whose runs trained on different machines differs
by both. A check trains a finished run again here, by its own settings, to one evaluation past
its best step (the schedule does not depend on train.num_steps, so that is the run's first
part), and records both dev curves:

    python -m experiments.table3 --preset=small --steps=1200 --seeds=0,1 --machine_check=f25/base

into <root>/machine_checks/<variant>/<row>/seed<K>/check.json (and the mirror's copy). It changes
no result and enters no rule: the report lists each check, and each pair that it makes whole
on one machine (a row run here, against its base run here), beside the registered verdicts.
"""

from __future__ import annotations

import json
import math

from experiments.table3 import stats
from experiments.table3.presets import run_overrides
from experiments.table3.runner import (
    finished_result,
    mirror_path,
    platform_of_log,
    this_cpu,
    train_in,
)
from tfm_jax.platform import storage
from tfm_jax.viz.curves import read_metrics

CHECKS = "machine_checks"


def check_dir(root: str, variant: str | None, row: str, seed: int) -> str:
    return storage.join(root, CHECKS, variant or "main", row, f"seed{seed}")


def parse(text: str) -> list[tuple[str | None, str]]:
    """'f25/base,C8' -> [("f25", "base"), (None, "C8")]."""
    out = []
    for name in filter(None, text.split(",")):
        variant, _, row = name.rpartition("/")
        out.append((variant or None, row))
    return out


def summarize(recorded: list, here: list, upto: int) -> dict:
    """Both curves up to `upto` as PPL, the relative difference at each evaluation, and each
    curve's best (step, PPL) there. Pure (tests/unit/test_table3_machines.py)."""
    mine = {int(s): float(v) for s, v in here}
    points = []
    for step, nll in recorded:
        if int(step) <= upto and int(step) in mine:
            a, b = math.exp(float(nll)), math.exp(mine[int(step)])
            points.append({"step": int(step), "recorded": a, "here": b, "relative": b / a - 1})
    if not points:
        raise ValueError(f"no evaluation in common up to step {upto}")
    best = {}
    for name in ("recorded", "here"):
        p = min(points, key=lambda q: (q[name], q["step"]))
        best[name] = {"step": p["step"], "ppl": p[name]}
    return {
        "points": points,
        "best": best,
        "best_relative": best["here"]["ppl"] / best["recorded"]["ppl"] - 1,
        "largest_relative": max((q["relative"] for q in points), key=abs),
        # the check's best at its last evaluation: the curve here may still have been falling
        "best_at_end": best["here"]["step"] == points[-1]["step"],
    }


def run_check(
    preset: str, row: str, seed: int, root: str, variant=None, env=None, mirror=None, **kw
) -> dict | None:
    """Trains the finished (variant, row, seed) run again here to one evaluation past its best
    and records the check; the recorded check where there is one; None if the run is not
    finished."""
    workdir = check_dir(root, variant, row, seed)
    copy = mirror_path(mirror, root, workdir)
    for where in (workdir, copy):
        if where and storage.exists(storage.join(where, "check.json")):
            return json.loads(storage.read_text(storage.join(where, "check.json")))
    result = finished_result(preset, row, seed, root, variant=variant, mirror=mirror, **kw)
    if result is None:
        return None
    overrides = run_overrides(preset, row, seed, root, variant=variant, **kw)
    every = overrides["train.eval_every_steps"]
    best = stats.best_point(result["dev_curve"])[0]
    upto = min(best + every, overrides["train.num_steps"])
    overrides["train.num_steps"] = upto
    storage.makedirs(workdir)
    train, log_path = train_in(row, workdir, overrides, env)
    check = {
        "variant": variant,
        "row": row,
        "seed": int(seed),
        "recorded_platform": result.get("platform"),
        "platform": platform_of_log(log_path) or this_cpu(),
        "steps": upto,
        "command": "python -m tfm_jax " + " ".join(train),
        **summarize(result["dev_curve"], stats.dev_curve(read_metrics(workdir)), upto),
    }
    text = json.dumps(check, indent=2)
    for where in (workdir, copy):
        if where:
            storage.makedirs(where)
            storage.write_text(storage.join(where, "check.json"), text)
    return check


def run_checks(preset: str, names: str, seeds: list[int], root: str, mirror, **kw) -> None:
    """--machine_check: each named run (VARIANT/ROW or ROW) of each seed, one line each."""
    for variant, row in parse(names):
        for seed in seeds:
            c = run_check(preset, row, seed, root, variant=variant, mirror=mirror, **kw)
            said = "not finished, nothing to check" if c is None else _check_line(c)
            print(f"{stats.run_name(variant, row, seed)}: {said}", flush=True)


def read_checks(root: str, mirror: str | None) -> list[dict]:
    """Every recorded check under the root or the mirror (the root's copy wins)."""
    found: dict[tuple, dict] = {}
    for base in filter(None, (mirror, root)):
        top = storage.join(base, CHECKS)
        if not storage.exists(top):
            continue
        for path in storage.path(top).glob("*/*/seed*/check.json"):  # variant/row/seedK
            c = json.loads(path.read_text())
            found[c.get("variant"), c["row"], c["seed"]] = c
    return [found[k] for k in sorted(found, key=lambda k: (k[0] or "", k[1], k[2]))]


def _check_line(c: dict) -> str:
    b = c["best"]
    end = " (its best here is its last evaluation: it may still have been falling)"
    return (
        f"recorded on {c['recorded_platform'] or 'a machine its result does not name'}, "
        f"trained on {c['platform']} to step "
        f"{c['steps']}: best dev PPL {b['recorded']['ppl']:.2f} (step {b['recorded']['step']}) "
        f"there, {b['here']['ppl']:.2f} (step {b['here']['step']}) here, "
        f"{c['best_relative']:+.1%}; largest difference at one evaluation "
        f"{c['largest_relative']:+.1%}" + (end if c["best_at_end"] else "") + "."
    )


def check_lines(checks: list[dict], results: list[dict]) -> list[str]:
    """The report's section: each check, then the pairs it puts on one machine (a run of the
    same variant and seed trained where the check was, against the check's best)."""
    if not checks:
        return []
    lines = [
        "Machine checks (experiments/table3/machines.py; in no rule): a finished run trained "
        "again on another machine by its own settings, to one evaluation past its best, shows "
        "how far the machine's arithmetic alone moves its dev PPL.",
        "",
    ]
    for c in checks:
        b = c["best"]
        lines.append(f"- {stats.run_name(c.get('variant'), c['row'], c['seed'])}, {_check_line(c)}")
        for r in results:
            same = (r.get("variant"), r.get("seed")) == (c.get("variant"), c["seed"])
            if same and r["row"] != c["row"] and r.get("platform") == c["platform"]:
                best = math.exp(stats.best_point(r["dev_curve"])[1])
                name = stats.run_name(r.get("variant"), r["row"], r["seed"])
                lines.append(
                    f"  - {name}, trained there too: "
                    f"{best / b['here']['ppl'] - 1:+.1%} against this {c['row']} "
                    f"({best / b['recorded']['ppl'] - 1:+.1%} against the recorded one)."
                )
    return lines + [""]
