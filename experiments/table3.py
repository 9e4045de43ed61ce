"""Reproduce Table 3 (model variations) by config overrides, over seeds, judged by a fixed protocol.

    python experiments/table3.py --preset=small --rows=all --seeds=0,1
    python experiments/table3.py --preset=small --rows=base,A1,C256 --seeds=0,1,2
    python experiments/table3.py --preset=paper --rows=all --print_commands   # for a GPU/TPU pod

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

    python experiments/table3.py --preset=small --rows=base --seeds=0 --steps=4000 \\
        --eval_every=100 --root=runs/table3_small_budget --out=runs/table3_small_budget
    python experiments/table3.py --find_budget=runs/table3_small_budget/base/seed0

then sweep with --steps=<the printed step> and a root of its own.

Old layout: results of the single-seed harness (<root>/<ROW>/result.json, its own vocabulary
per row) are not read; the script names any it finds and leaves them alone.

Presets:
  paper  WMT14 EN-DE through tfds, newstest2013 dev, 100K steps (big: 300K), ~25k+25k tokens.
  small  Multi30k EN-DE on a 2-core CPU. Every row is the paper's row scaled by the same
         factors: widths (d_model, d_ff, d_k, d_v) x 1/4, layers x 1/2 (C2 -> 1 layer), heads
         unchanged, steps 100K -> 1,200 by default (--steps; big keeps its 3x), packed batches
         of 8,192 tokens a side, bf16 compute, warmup 100 steps with lr_factor 0.5 (the same
         schedule for every row, so its d_model^-0.5 factor still differs between rows as in
         the paper). The budget and its curve: experiments/results/table3_small_budget.md.
  gpu    the small preset's runs (same rows, data, budget, schedule) on one GPU, 8 at a
         time (--parallel) and 3 seeds by default; its own root and report (table3_gpu.*).
  micro  a seconds-long smoke test of the harness itself (CI).

--parallel N runs N (row, seed) runs at once after the first (which builds the shared vocabulary
and token cache), each its own process; with N > 1 each process may take 0.9/N of a GPU's
memory. A run's numbers do not depend on what runs beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import table3_stats as stats  # noqa: E402
from table3_report import write_table  # noqa: E402

from tfm_jax.config import paths  # noqa: E402
from tfm_jax.config.build import load_config_module  # noqa: E402
from tfm_jax.platform import host, storage  # noqa: E402

# The rows (and the paper's numbers) live in the config file the runs are started with.
TABLE3_CONFIG = load_config_module(os.path.join(REPO, "configs", "table3.py"))
TABLE3 = TABLE3_CONFIG.ROWS

# Base's steps in the small preset: where its dev NLL stopped improving by 0.01 nats
# (experiments/results/table3_small_budget.md); big trains 3x, as in the paper.
SMALL_BASE_STEPS = 1200
WIDTH_KEYS = ("model.d_model", "model.d_ff", "model.d_k", "model.d_v")
PRESETS = ("paper", "small", "gpu", "micro")
DEFAULT_SEEDS = {"paper": "0,1", "small": "0,1", "gpu": "0,1,2", "micro": "0"}
# Runs at once (--parallel): a small-preset model uses a sliver of one GPU, and what each run
# costs there is mostly its process start, compilations and beam search, not its steps.
DEFAULT_PARALLEL = {"paper": 1, "small": 1, "gpu": 8, "micro": 1}
# Overrides that change how often a run logs, evaluates or saves, not what it learns: a finished
# or half-finished run may be continued under other values of these.
CADENCE_KEYS = (
    "train.log_every_steps",
    "train.eval_every_steps",
    "train.checkpoint_every_steps",
    "train.checkpoint_every_secs",
    "train.keep_checkpoints",
)


def row_model(row: str) -> dict:
    """The paper's hyper-parameters of a row (base filled in), as dotted config keys."""
    cfg = TABLE3_CONFIG.row_config(row)
    return {
        "model.num_layers": cfg.model.num_layers,
        "model.d_model": cfg.model.d_model,
        "model.d_ff": cfg.model.d_ff,
        "model.num_heads": cfg.model.num_heads,
        "model.d_k": cfg.model.d_k,
        "model.d_v": cfg.model.d_v,
        "model.dropout": cfg.model.dropout,
        "model.positional": cfg.model.positional,
        "loss.label_smoothing": cfg.loss.label_smoothing,
        "train.num_steps": cfg.train.num_steps,
    }


def step_multiple(row: str) -> int:
    """A row's steps over base's in the paper (big: 3), kept at every budget."""
    return row_model(row)["train.num_steps"] // row_model("base")["train.num_steps"]


def scaled(row: str, width: float, depth: float, base_steps: int) -> dict:
    """One row scaled by the same factors as every other row."""
    paper = row_model(row)
    out = dict(paper)
    for key in WIDTH_KEYS:
        out[key] = max(1, int(round(paper[key] * width)))
    out["model.num_layers"] = max(1, int(round(paper["model.num_layers"] * depth)))
    out["train.num_steps"] = max(1, base_steps * step_multiple(row))
    return out


def preset_overrides(preset: str, row: str, data_dir: str | None, steps: int | None = None) -> dict:
    """The preset's overrides of one row; `steps` (base's budget) replaces the preset's."""
    o = _preset(preset, row, data_dir)
    if steps is not None:
        o["train.num_steps"] = steps * step_multiple(row)
    return o


def _preset(preset: str, row: str, data_dir: str | None) -> dict:
    if preset == "paper":
        return {**row_model(row)}
    if preset in ("small", "gpu"):  # gpu: the small protocol, run --parallel on one GPU
        o = scaled(row, width=0.25, depth=0.5, base_steps=SMALL_BASE_STEPS)
        o.update({
            "data.source": "folder",
            "data.dir": data_dir or os.path.join(REPO, "..", "shared", "data", "multi30k"),
            "data.train_split": "train",
            "data.eval_split": "val",
            "data.test_split": "test_2016_flickr",
            "model.vocab_size": 8000,
            "model.max_len": 128,
            "data.max_len": 128,
            "data.tokens_per_batch": 8192,
            "data.packing": True,
            "data.packed_length": 128,
            # bf16 compute, float32 master weights: 1.26x faster a step on the 2-core CPU
            # (experiments/results/table3_small_budget.md) at the same dev curve.
            "model.dtype": "bfloat16",
            # 8% of the default 1,200 steps, and kept at any --steps: the schedule then does not
            # depend on the budget. lr_factor 0.5 puts base's peak at 4.4e-3 (the paper's
            # formula at warmup 100 would peak at 8.8e-3). Other rows keep the d_model^-0.5
            # dependence.
            "optim.warmup_steps": 100,
            "optim.lr_factor": 0.5,
            "train.log_every_steps": 50,
            "train.eval_every_steps": 100_000,  # run_overrides: 10 a run, or --eval_every
            "train.checkpoint_every_steps": 200,
            "train.checkpoint_every_secs": 0.0,
            "train.keep_checkpoints": 2,
            "decode.max_extra_len": 50,
        })  # fmt: skip
        return o
    if preset == "micro":
        o = scaled(row, width=1 / 32, depth=1 / 6, base_steps=5)
        o.update({
            "data.source": "folder",
            "data.dir": data_dir,
            "data.train_split": "train",
            "data.eval_split": "val",
            "data.test_split": "val",
            "model.vocab_size": 256,
            "model.max_len": 64,
            "data.max_len": 64,
            "data.tokens_per_batch": 512,
            "data.packing": True,
            "data.packed_length": 64,
            "optim.warmup_steps": 4,
            "train.log_every_steps": 5,
            "train.eval_every_steps": 100_000,
            "train.checkpoint_every_steps": 0,
            "train.checkpoint_every_secs": 0.0,
            "train.keep_checkpoints": 1,
            "decode.max_extra_len": 5,
        })  # fmt: skip
        return o
    raise SystemExit(f"unknown preset {preset!r}: use {', '.join(PRESETS)}")


def run_overrides(
    preset: str,
    row: str,
    seed: int,
    root: str,
    data_dir: str | None = None,
    steps: int | None = None,
    eval_every: int | None = None,
) -> dict:
    """Everything one (row, seed) run is started with beyond its row: preset, budget, seed and
    the vocabulary every row and seed share."""
    o = preset_overrides(preset, row, data_dir, steps)
    # One vocabulary for every row and seed (the first run trains it): the same tokens, so the
    # same batches for a given seed.
    o["data.vocab_path"] = storage.join(root, "vocab", f"spm_{_vocab_size(o)}.model")
    o["train.seed"] = int(seed)
    if eval_every:
        o["train.eval_every_steps"] = int(eval_every)
    elif preset in ("small", "gpu"):  # ten points of each row's dev curve: did it plateau?
        o["train.eval_every_steps"] = max(1, o["train.num_steps"] // 10)
    return o


def _vocab_size(o: dict) -> int:
    return o.get("model.vocab_size") or TABLE3_CONFIG.get_config("base").model.vocab_size


def cli_args(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def parallel_env(parallel: int) -> dict:
    """Environment of each run when `parallel` share one accelerator: JAX would otherwise
    reserve 75% of a GPU's memory in the first process and leave the others none."""
    if parallel < 1:
        raise SystemExit(f"--parallel={parallel}: at least 1")
    if parallel == 1 or "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:
        return {}
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / parallel:.3f}"}


def run_cmd(
    args: list[str], log_path: str, env: dict | None = None, program: list[str] | None = None
) -> str:
    """Runs `python -m tfm_jax ...`, teeing output to a log; returns stdout's last line.

    A command the kernel killed (SIGKILL: on Linux most often its out-of-memory killer) while
    the CPU malloc tunables were on runs once more without them: they hold the heap at its
    high-water mark, which the small preset's A32 row takes past 24 GB (4.9 GB without them,
    the same numbers; tfm_jax/platform/host.py). A train resumes from its last checkpoint.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    program = program or [sys.executable, "-m", "tfm_jax"]
    proc = _run_logged(program, args, log_path, env)
    had_tunables, retried = host.child_has_tunables(env), False
    if proc.returncode == -signal.SIGKILL and had_tunables:
        note = (
            f"`python -m tfm_jax {args[0]}` was killed (SIGKILL), most often by the kernel's "
            "out-of-memory killer; running it again with TFM_JAX_MALLOC_TUNABLES=0 (a smaller "
            "heap, slower CPU steps, the same numbers)"
        )
        print(f"{log_path}: {note}", flush=True)
        with open(log_path, "a") as log:
            log.write(note + "\n")
        retried = True
        proc = _run_logged(program, args, log_path, host.without_malloc_tunables(env))
    if proc.returncode != 0:
        without = retried or not had_tunables
        raise RuntimeError(failure_message(args[0], proc.returncode, log_path, without))
    return proc.stdout.strip().splitlines()[-1]


def _run_logged(program: list[str], args: list[str], log_path: str, env: dict):
    """Runs one command with stderr and stdout appended to the log as they come (a run cut
    short, or a sweep killed, still shows its progress lines there)."""
    with open(log_path, "a") as log:
        log.write(f"$ python -m tfm_jax {' '.join(args)}\n")
        log.flush()
        with subprocess.Popen(
            [*program, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        ) as proc:
            lines = []
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
        return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines))


def failure_message(
    command: str, returncode: int, log_path: str, without_tunables: bool = False
) -> str:
    """What a failed `python -m tfm_jax COMMAND` says: its exit status or signal, and its log."""
    if returncode == 75:  # tfm_jax.train.preemption.EXIT_CODES["SIGTERM"]
        return (
            f"`python -m tfm_jax {command}` stopped on SIGTERM with a checkpoint (exit 75); "
            f"rerunning the sweep resumes it; see {log_path}"
        )
    if returncode >= 0:
        return f"`python -m tfm_jax {command}` failed (exit status {returncode}); see {log_path}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    msg = f"`python -m tfm_jax {command}` was killed by {name}; see {log_path}"
    if -returncode == signal.SIGKILL:
        msg += (
            ". A SIGKILL leaves no traceback: on Linux it is most often the kernel's "
            "out-of-memory killer (`dmesg` says). The log's RSS lines show the memory it "
            "reached; rerunning the sweep resumes the run from its last checkpoint"
        )
        msg += (
            ". It was killed without the CPU malloc tunables too: this run needs a host "
            "with more memory"
            if without_tunables
            else ", with less memory under TFM_JAX_MALLOC_TUNABLES=0 in the environment"
        )
    return msg


def workdir_of(root: str, row: str, seed: int) -> str:
    return storage.join(root, row, f"seed{seed}")


def _substance(overrides: dict) -> dict:
    """The overrides that decide what a run learns; paths compared as the files they name."""
    out = {k: v for k, v in overrides.items() if k not in CADENCE_KEYS}
    for key in ("data.dir", "data.vocab_path"):
        if out.get(key) and not storage.is_remote(out[key]):
            out[key] = os.path.realpath(out[key])
    return out


def _check_same_run(workdir: str, recorded: dict, overrides: dict) -> None:
    """A workdir continues only the experiment it was started for (else: another --root)."""
    old, new = _substance(recorded), _substance(json.loads(json.dumps(overrides)))
    if old != new:
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise SystemExit(
            f"{workdir} was started with other settings ({', '.join(changed)}: "
            f"{[old.get(k) for k in changed]} there, {[new.get(k) for k in changed]} now); "
            "pass another --root for a different budget or preset"
        )


def _read_result(workdir: str, overrides: dict) -> dict | None:
    """A workdir's result.json, checked to be this experiment's; None when it is not finished."""
    result_path = storage.join(workdir, "result.json")
    if not storage.exists(result_path):
        return None
    result = json.loads(storage.read_text(result_path))
    _check_same_run(workdir, result["overrides"], overrides)
    return result


def finished_result(preset: str, row: str, seed: int, root: str, **kw) -> dict | None:
    """A finished (row, seed) run's result, or None (--report_only: nothing is trained)."""
    overrides = run_overrides(preset, row, seed, root, **kw)
    return _read_result(workdir_of(root, row, seed), overrides)


def run_one(preset: str, row: str, seed: int, root: str, env: dict | None = None, **kw) -> dict:
    """Trains and evaluates one (row, seed), unless its result.json exists (then reads it)."""
    workdir = workdir_of(root, row, seed)
    overrides = run_overrides(preset, row, seed, root, **kw)
    done = _read_result(workdir, overrides)
    if done is not None:
        return done
    result_path = storage.join(workdir, "result.json")
    storage.makedirs(workdir)
    started = storage.join(workdir, "harness.json")
    if storage.exists(started):
        _check_same_run(workdir, json.loads(storage.read_text(started)), overrides)
    storage.write_text(started, json.dumps(overrides, indent=2))
    log_path = local_log(workdir)
    t0 = time.time()
    train_args = ["train", f"--config=configs/table3.py:{row}", f"--workdir={workdir}"]
    run_cmd(train_args + cli_args(overrides), log_path, env)
    train_s = time.time() - t0
    eval_args = ["evaluate", f"--workdir={workdir}", "--split=validation", "--checkpoint=latest"]
    save_log(log_path, workdir)
    scores = json.loads(run_cmd(eval_args, log_path, env))
    eval_s = time.time() - t0 - train_s
    params = json.loads(
        run_cmd(
            ["params", f"--config=configs/table3.py:{row}", "--json"] + cli_args(overrides),
            log_path,
            env,
        )
    )["rows"]
    curve = stats.dev_curve(stats.read_metrics(workdir))
    result = {
        "row": row,
        "seed": int(seed),
        "overrides": overrides,
        "ppl": scores["ppl"],
        "bleu": scores["bleu"],
        "bleu_tok_compound": scores.get("bleu_tok_compound"),
        "params": next(iter(params.values()))["params"],
        "dev_curve": curve,  # (step, dev NLL) of the evaluations during training
        "plateau_step": stats.plateau_step(curve),
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "command": "python -m tfm_jax " + " ".join(train_args + cli_args(overrides)),
    }
    save_log(log_path, workdir)
    # written whole (storage.write_text): a run counts as done only when its result is complete
    storage.write_text(result_path, json.dumps(result, indent=2))
    return result


def local_log(workdir: str) -> str:
    """The run's log.txt, appended to as the commands run: in the workdir, or for a gs://
    workdir (object storage cannot append) in local scratch, copied there by `save_log`."""
    if not storage.is_remote(workdir):
        return os.path.join(workdir, "log.txt")
    digest = hashlib.sha256(workdir.encode()).hexdigest()[:12]
    local = os.path.join(storage.scratch_dir(), "logs", digest, "log.txt")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    return local


def save_log(log_path: str, workdir: str) -> None:
    if storage.is_remote(workdir) and os.path.exists(log_path):
        storage.path(log_path).copy(storage.path(storage.join(workdir, "log.txt")), overwrite=True)


def legacy_results(root: str, rows: list[str]) -> list[str]:
    """Result files of the old single-seed layout under `root` (read by nothing here)."""
    found = (storage.join(root, r, "result.json") for r in rows)
    return [p for p in found if storage.exists(p)]


def find_budget(path: str, threshold: float) -> dict:
    """The plateau of a (base) run's dev curve: the step to use as --steps."""
    curve = stats.dev_curve(stats.read_metrics(path))
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
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
    p.add_argument("--print_commands", action="store_true", help="print, don't run")
    p.add_argument(
        "--report_only",
        action="store_true",
        help="write the report from the (row, seed) runs already finished under --root "
        "and train nothing (e.g. while the sweep runs elsewhere)",
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
    args = p.parse_args(argv)
    paths.resolve_args(args, ("root", "out", "data_dir", "find_budget"))
    if args.find_budget:
        print(json.dumps(find_budget(args.find_budget, args.threshold)))
        return 0
    rows = list(TABLE3) if args.rows == "all" else args.rows.split(",")
    unknown = [r for r in rows if r not in TABLE3]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; Table 3 rows: {', '.join(TABLE3)}")
    if "base" in rows:  # every comparison needs base: run it first
        rows = ["base"] + [r for r in rows if r != "base"]
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS[args.preset])
    steps = args.steps or preset_overrides(args.preset, "base", None)["train.num_steps"]
    root = args.root or os.path.join(REPO, "runs", f"table3_{args.preset}")
    kw = dict(data_dir=args.data_dir, steps=steps, eval_every=args.eval_every)
    if args.print_commands:
        for row in rows:
            for seed in seeds:
                o = run_overrides(args.preset, row, seed, root, **kw)
                print(
                    f"python -m tfm_jax train --config=configs/table3.py:{row} "
                    f"--workdir={workdir_of(root, row, seed)} " + " ".join(cli_args(o))
                )
        return 0
    for old in legacy_results(root, rows):
        print(f"not read (the old single-seed layout, its own vocabulary): {old}", flush=True)
    # the sweep's command: a --report_only report names the command that trains its runs
    argv_shown = [a for a in (argv or sys.argv[1:]) if a != "--report_only"]
    command = "python experiments/table3.py " + " ".join(argv_shown)
    todo = [(row, seed) for row in rows for seed in seeds]  # row by row: base first
    done: dict[tuple[str, int], dict] = {}
    tables: list[str] = []
    big_steps = steps * step_multiple("big")

    def one(row: str, seed: int) -> None:
        nonlocal tables
        t0 = time.time()
        if args.report_only:
            r = finished_result(args.preset, row, seed, root, **kw)
            if r is None:
                return
        else:
            r = run_one(args.preset, row, seed, root, env=env, **kw)
        print(
            f"{row} seed {seed}: ppl {r['ppl']:.2f} bleu {r['bleu']:.2f} "
            f"params {r['params'] / 1e6:.2f}M ({time.time() - t0:.0f} s)",
            flush=True,
        )
        with lock:  # each finished run rewrites the report, in (row, seed) order
            done[row, seed] = r
            results = [done[k] for k in todo if k in done]
            tables = write_table(args.preset, results, args.out, command, seeds, steps, big_steps)

    lock = threading.Lock()
    parallel = DEFAULT_PARALLEL[args.preset] if args.parallel is None else args.parallel
    env = parallel_env(parallel)
    if parallel == 1 or args.report_only:
        for row, seed in todo:
            one(row, seed)
    else:
        # The first run alone: it trains the shared vocabulary and token cache the others read.
        one(*todo[0])
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(one, row, seed) for row, seed in todo[1:]]
            for f in concurrent.futures.as_completed(futures):
                if f.exception() is not None:  # the error names the run's log
                    pool.shutdown(cancel_futures=True)  # the running ones finish, no new ones
                    raise f.exception()
    print(json.dumps({"tables": tables}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
