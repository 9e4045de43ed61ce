"""Reproduce Table 3 (model variations) by config overrides, over seeds, judged by a fixed protocol.

    python -m experiments.table3 --preset=small --rows=all --seeds=0,1
    python -m experiments.table3 --preset=small --rows=base,A1,C256 --seeds=0,1,2
    python -m experiments.table3 --preset=paper --rows=all --print_commands   # for a GPU/TPU pod

Each (row, seed) runs as `python -m tfm_jax train --config=configs/table3.py:ROW --config.*=...
--config.train.seed=K` in its own workdir <root>/<ROW>/seed<K>/, then `python -m tfm_jax evaluate
--split=validation --checkpoint=latest` (dev perplexity and dev BLEU with beam search and no
checkpoint averaging, as the paper does for Table 3). A (row, seed) whose result.json exists is
not rerun; an interrupted one resumes from its newest checkpoint. Results:
experiments/results/table3_<preset>.{md,csv,png} and table3_<preset>_seeds.csv (one line a run).

Seeds. train.seed is the only seed a run has: it draws the initial parameters, the dropout masks
AND the order of the training batches (data/batching.py and plans.py shuffle by (seed, epoch)).
Every row of a preset has the same data settings and one shared vocabulary (<root>/vocab/), so
seed K gives every row the same batches in the same order: the data order varies with the seed,
identically for all rows. A row's difference from base is then paired per seed (same data
order), and the spread over seeds includes the data-order noise a rerun would see.

Budget. Every row trains the same number of steps on batches of the same token count (the same
token budget); big trains 3x as long, as in the paper. The learning-rate schedule does not depend
on train.num_steps, so a long base run with frequent dev evaluations shows what every shorter
budget would have reached. To choose the budget from that curve:

    python -m experiments.table3 --preset=small --rows=base --seeds=0 --steps=4000 \\
        --eval_every=100 --root=runs/table3_small_budget --out=runs/table3_small_budget
    python -m experiments.table3 --find_budget=runs/table3_small_budget/base/seed0

then sweep with --steps=<the printed step> and a root of its own.

BLEU at the best checkpoint. `--bleu_at_best` replays the finished runs of --rows whose BLEU
is their latest checkpoint's (they predate keeping the best) to their best step, and takes that
BLEU where the replay is the run (experiments/table3/replay.py).

Explanations. `--explain=all` (or names: E,heads,seed3,budget,data) runs the pre-registered
explanation experiments of experiments/table3/explain.py (probe rows, a third seed, variants of
the protocol under <root>/variants/) and the report judges each by its registered rule.

Across machines. Each finished run's result.json is also written to --mirror (default
experiments/results/<root's name>_runs/, the folder to commit; a run that finished before that
mirror was named is copied there by the next sweep that reads it); a sweep on a new machine
reads the finished runs from there and skips them. The shared vocabulary is mirrored as well
(<mirror>/vocab/): a root without one takes the mirror's, the pieces the finished runs used
(each result records its sha256, and one of other pieces is refused). An unfinished run
restarts from its last checkpoint (one each 10 minutes) if its workdir survived, else from
scratch.

Old layout: results of the single-seed harness (<root>/<ROW>/result.json, its own vocabulary
per row) are not read; the script names any it finds and leaves them alone.

Presets (experiments/table3/presets.py):
  paper  WMT14 EN-DE through tfds, newstest2013 dev, 100K steps (big: 300K), ~25k+25k tokens.
  small  Multi30k EN-DE on a 2-core CPU, with configs/small.py's data settings. Every row is
         the paper's row scaled by the same factors: widths (d_model, d_ff, d_k, d_v) x 1/4,
         layers x 1/2 (C2 -> 1 layer), heads unchanged, steps 100K -> 1,200 by default
         (--steps; big keeps its 3x), packed batches of 8,192 tokens a side, bf16 compute,
         warmup 100 steps with lr_factor 0.5 (the same schedule for every row, so its
         d_model^-0.5 factor still differs between rows as in the paper). The budget and its
         curve: experiments/results/table3_small_budget.md.
  gpu    the small preset's runs (same rows, data, budget, schedule) on one GPU, 8 at a
         time (--parallel) and 3 seeds by default; its own root and report (table3_gpu.*).
  micro  a seconds-long smoke test of the harness itself (CI).

--parallel N runs N (row, seed) runs at once, each its own process, after the first where the
root has no vocabulary yet (that run trains the one the others read); with N > 1 each process
may take 0.9/N of a GPU's memory. A run's numbers do not depend on what runs beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time

from experiments import REPO
from experiments.table3 import explain, machines, replay, stats
from experiments.table3.commands import parallel_env
from experiments.table3.presets import (
    ALL_ROWS,
    DEFAULT_PARALLEL,
    DEFAULT_SEEDS,
    PRESETS,
    TABLE3,
    cli_args,
    preset_overrides,
    run_overrides,
    step_multiple,
)
from experiments.table3.report import write_table
from experiments.table3.runner import (
    finished_result,
    legacy_results,
    mirror_of,
    run_one,
    share_vocab,
    workdir_of,
)
from tfm_jax.config import paths
from tfm_jax.platform import storage
from tfm_jax.viz.curves import read_metrics


def find_budget(path: str, threshold: float) -> dict:
    """The plateau of a (base) run's dev curve: the step to use as --steps."""
    curve = stats.dev_curve(read_metrics(path))
    step = stats.plateau_step(curve, threshold)
    out = {
        "metrics": path,
        "evals": len(curve),
        "last_step": curve[-1][0] if curve else None,
        "threshold_nats": threshold,
        "plateau_step": step,
    }
    if step is None:
        out["advice"] = "no plateau yet: train base longer (or evaluate more often) and rerun"
    else:
        out["advice"] = f"sweep with --steps={step} (big: {step * step_multiple('big')})"
    return out


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds={text!r}: comma-separated integers, e.g. 0,1") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds={text!r}: at least one seed, none twice")
    return seeds


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.table3",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--preset", default="small", choices=PRESETS)
    p.add_argument("--rows", default="all", help="comma-separated Table 3 rows, or 'all'")
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated train.seed values, each row run once per seed "
        f"(default: {DEFAULT_SEEDS})",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="base's training steps, the same for every row (big: 3x); default: "
        "the preset's (paper 100K, small 1,200, micro 5)",
    )
    p.add_argument(
        "--eval_every",
        type=int,
        default=None,
        help="dev evaluation every N steps during training (the curve in "
        "result.json and --find_budget); default: small 10 a run, paper every 5K, "
        "micro at the end",
    )
    p.add_argument("--root", default=None, help="default: runs/table3_<preset>")
    p.add_argument("--out", default=os.path.join(REPO, "experiments", "results"))
    p.add_argument("--data_dir", default=None, help="small/micro: the parallel-text folder")
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        help=f"runs at once, sharing the machine (default {DEFAULT_PARALLEL}); on a GPU each "
        "gets an equal share of its memory",
    )
    p.add_argument(
        "--explain",
        default=None,
        help="run the pre-registered explanation experiments instead of --rows: 'all' or "
        f"names ({', '.join(explain.BY_NAME)})",
    )
    p.add_argument(
        "--mirror",
        default=None,
        help="where finished results are copied and read back (default: "
        "experiments/results/<root's name>_runs for every preset but micro; 'none': off)",
    )
    p.add_argument("--print_commands", action="store_true", help="print, don't run")
    p.add_argument(
        "--report_only",
        action="store_true",
        help="write the report from the (row, seed) runs already finished under --root "
        "and train nothing (e.g. while the sweep runs elsewhere)",
    )
    p.add_argument(
        "--bleu_at_best",
        action="store_true",
        help="for the finished --rows runs whose BLEU is their latest checkpoint's, not their "
        "best's (made before the best was kept): replay each to its best step and take that "
        "BLEU where the replay's dev curve is the run's (experiments/table3/replay.py); "
        "trains nothing else",
    )
    p.add_argument(
        "--machine_check",
        default=None,
        metavar="RUNS",
        help="train these finished runs (VARIANT/ROW or ROW, comma-separated; each of --seeds) "
        "again here to one evaluation past their best, and record how far this machine moves "
        "their dev curve (experiments/table3/machines.py); changes no result; then the report",
    )
    p.add_argument(
        "--find_budget",
        default=None,
        metavar="RUN",
        help="print the step where RUN's dev NLL stops improving (RUN: a workdir or "
        "its metrics.jsonl), then exit",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.01,
        help="--find_budget: the smallest dev NLL improvement (nats) that counts",
    )
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    mirror_off = args.mirror == "none"  # before resolving: "none" is a word, not a folder
    paths.resolve_args(args, ("root", "out", "data_dir", "find_budget", "mirror"))
    if args.find_budget:
        print(json.dumps(find_budget(args.find_budget, args.threshold)))
        return 0
    rows = list(TABLE3) if args.rows == "all" else args.rows.split(",")
    unknown = [r for r in rows if r not in ALL_ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; rows: {', '.join(ALL_ROWS)}")
    if "base" in rows:  # every comparison needs base: run it first
        rows = ["base"] + [r for r in rows if r != "base"]
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS[args.preset])
    todo = [(None, row, seed) for row in rows for seed in seeds]  # row by row: base first
    if args.explain:
        names = list(explain.BY_NAME) if args.explain == "all" else args.explain.split(",")
        bad = [n for n in names if n not in explain.BY_NAME]
        if bad:
            raise SystemExit(f"unknown --explain {bad}; experiments: {', '.join(explain.BY_NAME)}")
        todo = explain.run_list(names)
    steps = args.steps or preset_overrides(args.preset, "base", None)["train.num_steps"]
    root = args.root or os.path.join(REPO, "runs", f"table3_{args.preset}")
    if mirror_off:
        args.mirror = None
    elif args.mirror is None and args.preset != "micro":
        args.mirror = mirror_of(root, os.path.join(REPO, "experiments", "results"))
    kw = dict(data_dir=args.data_dir, steps=steps, eval_every=args.eval_every)
    if args.print_commands:
        for variant, row, seed in todo:
            o = run_overrides(args.preset, row, seed, root, variant=variant, **kw)
            print(
                f"python -m tfm_jax train --config=configs/table3.py:{row} "
                f"--workdir={workdir_of(root, row, seed, variant)} " + " ".join(cli_args(o))
            )
        return 0
    for old in legacy_results(root, rows):
        print(f"not read (the old single-seed layout, its own vocabulary): {old}", flush=True)
    # the sweep's command: a --report_only report names the command that trains its runs
    # (without the one-off modes: --machine_check's value too, whether "=RUNS" or the next word)
    argv_shown, given = [], list(argv or sys.argv[1:])
    for i, a in enumerate(given):
        one_off = a in ("--report_only", "--bleu_at_best") or a.startswith("--machine_check")
        if not one_off and not (i and given[i - 1] == "--machine_check"):
            argv_shown.append(a)
    command = "python -m experiments.table3 " + " ".join(argv_shown)
    # the report reads every run finished so far: the sweep's and the explanations'
    report_runs = [(None, row, seed) for row in TABLE3 for seed in seeds]
    report_runs += [k for k in explain.run_list(list(explain.BY_NAME)) if k not in report_runs]
    if args.machine_check:
        machines.run_checks(args.preset, args.machine_check, seeds, root, args.mirror, **kw)
        args.report_only = True  # then the report, with the checks, from the finished runs
    tables = sweep(args, todo, report_runs, seeds, root, kw, command)
    print(json.dumps({"tables": tables}))
    return 0


def sweep(args, todo: list, report_runs: list, seeds, root: str, kw: dict, command: str) -> list:
    """Runs (or with --report_only reads) every (variant, row, seed) of `todo`, in order,
    --parallel at once (after the first, if it must train the vocabulary); each finished run
    rewrites the report, which reads every run of `report_runs` finished so far. Returns the
    report's files."""
    steps = kw["steps"]
    big_steps = steps * step_multiple("big")
    done: dict[tuple, dict] = {}
    tables: list[str] = []
    lock = threading.Lock()
    parallel = DEFAULT_PARALLEL[args.preset] if args.parallel is None else args.parallel
    env = parallel_env(parallel)
    where = dict(root=root, mirror=args.mirror)
    # the mirror's vocabulary, if the root has none: the finished runs' very pieces
    vocab_path = run_overrides(args.preset, "base", 0, root, **kw)["data.vocab_path"]
    share_vocab(vocab_path, **where)
    for key in report_runs:  # what is finished already (here or in the mirror)
        if key not in todo:
            variant, row, seed = key
            r = finished_result(args.preset, row, seed, variant=variant, **where, **kw)
            if r is not None:
                done[key] = r
    order = todo + [k for k in report_runs if k not in todo]
    checks = machines.read_checks(root, args.mirror)

    def one(variant: str | None, row: str, seed: int) -> None:
        nonlocal tables
        t0 = time.time()
        if args.report_only or (args.bleu_at_best and variant):
            r = finished_result(args.preset, row, seed, variant=variant, **where, **kw)
            if r is None:
                return
        elif args.bleu_at_best:
            r = replay.bleu_at_best(args.preset, row, seed, env=env, **where, **kw)
            if r is None:
                return
        else:
            r = run_one(args.preset, row, seed, env=env, variant=variant, **where, **kw)
        print(
            f"{stats.run_name(variant, row, seed)}: ppl {r['ppl']:.2f} bleu {r['bleu']:.2f} "
            f"params {r['params'] / 1e6:.2f}M ({time.time() - t0:.0f} s)",
            flush=True,
        )
        with lock:  # each finished run rewrites the report, in (variant, row, seed) order
            done[variant, row, seed] = r
            results = [dict(done[k], variant=k[0]) for k in order if k in done]
            tables = write_table(
                args.preset, results, args.out, command, seeds, steps, big_steps, checks
            )

    if parallel == 1 or args.report_only or args.bleu_at_best:
        for key in todo:
            one(*key)
    else:
        # The first run alone while there is no vocabulary yet: it trains the one the others
        # read. (Token caches are built atomically, so runs beside each other may share one.)
        rest = todo
        if not storage.exists(vocab_path):
            one(*todo[0])
            rest = todo[1:]
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(one, *key) for key in rest]
            for f in concurrent.futures.as_completed(futures):
                if f.exception() is not None:  # the error names the run's log
                    pool.shutdown(cancel_futures=True)  # the running ones finish, no new ones
                    raise f.exception()
    return tables
