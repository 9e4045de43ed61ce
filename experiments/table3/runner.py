"""One (row, seed) run of the Table 3 sweep: in its own workdir <root>/<ROW>/seed<K>/ (a
variant's: <root>/variants/<NAME>/<ROW>/seed<K>/), `python -m tfm_jax train`, then `evaluate
--split=validation` (dev perplexity and dev BLEU with beam search and no checkpoint averaging, as
the paper does for Table 3) at the best checkpoint and at the latest (its scores: the size).

The best checkpoint: every dev evaluation step is also a checkpoint step, all are kept while the
run trains, and once it is evaluated only the best (lowest dev NLL) and the latest stay.

A (row, seed) whose result.json exists is not rerun (the result is the cache). The results are
also mirrored into a folder meant to be committed (`mirror`: experiments/results/<root's
name>_runs/ by default): on a new machine a sweep reads a finished run from there and skips it.
The vocabulary every run shares (<root>/vocab/) is mirrored too, and each result records its
digest: a new machine takes the mirror's file instead of retraining one, and a result made with
other pieces than the root's is refused. An interrupted run resumes from its newest checkpoint
(one each 10 minutes, beside the evaluations'). A workdir continues only the experiment it was
started for: its harness.json records the overrides, and other settings are refused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time

from experiments import REPO
from experiments.table3 import stats
from experiments.table3.commands import local_log, run_cmd, save_log
from experiments.table3.presets import VARIANTS, cli_args, run_overrides
from tfm_jax.checkpoint import layout
from tfm_jax.platform import host, storage
from tfm_jax.train.resume import CADENCE_KEYS
from tfm_jax.viz.curves import read_metrics


def workdir_of(root: str, row: str, seed: int, variant: str | None = None) -> str:
    if variant:
        return storage.join(root, "variants", variant, row, f"seed{seed}")
    return storage.join(root, row, f"seed{seed}")


def _where(path: str) -> str:
    """A local path as the same file on another machine would be named: the vocabulary under
    the sweep's root by its place there, data in a shared/ folder (the project's data beside
    its checkout: ../shared) by its place in it, wherever the recording machine kept that
    folder; other data beside the checkout by its place beside it; anything else by its real
    path."""
    real = os.path.realpath(path)
    if os.sep + "vocab" + os.sep in real:  # <root>/vocab/spm_N.model: the root's own
        return "<root>" + real[real.rindex(os.sep + "vocab" + os.sep) :]
    if os.sep + "shared" + os.sep in real:  # /work/shared/data/x and /home/u/shared/data/x alike
        return "<shared>" + real[real.rindex(os.sep + "shared" + os.sep) + len("/shared") :]
    beside = os.path.dirname(os.path.realpath(REPO))
    if real.startswith(beside + os.sep):
        return "<beside checkout>" + real[len(beside) :]
    return real


def _substance(overrides: dict) -> dict:
    """The overrides that decide what a run learns; paths compared as the files they name."""
    out = {k: v for k, v in overrides.items() if k not in CADENCE_KEYS}
    for key in ("data.dir", "data.vocab_path"):
        if out.get(key) and not storage.is_remote(out[key]):
            out[key] = _where(out[key])
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


def mirror_of(root: str, out: str) -> str:
    """The committed copy of a root's results: <out>/<root's name>_runs."""
    return os.path.join(out, os.path.basename(os.path.normpath(root)) + "_runs")


def vocab_digest(path: str) -> str | None:
    """The vocabulary file's sha256 (16 hex digits); None while it does not exist."""
    if not storage.exists(path):
        return None
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()[:16]


def share_vocab(vocab_path: str, root: str, mirror: str | None) -> None:
    """One vocabulary for the sweep on every machine: a root without it takes the mirror's copy
    (the very pieces the mirrored results were trained with), and a mirror without it gets the
    root's once it exists."""
    copy = mirror_path(mirror, root, vocab_path)
    if copy is None:
        return
    if not storage.exists(vocab_path) and os.path.exists(copy):
        storage.makedirs(os.path.dirname(vocab_path))
        storage.write_bytes(vocab_path, storage.read_bytes(copy))
    elif storage.exists(vocab_path) and not os.path.exists(copy):
        storage.makedirs(os.path.dirname(copy))
        storage.write_bytes(copy, storage.read_bytes(vocab_path))


def data_digest(data_dir: str | None) -> str | None:
    """The parallel-text folder's sha256 (16 hex digits) over its files' names and bytes; None
    when there is no such folder (tfds data). It matches a result to the data it was trained on
    where _where only matches the path's shape."""
    if not data_dir or not storage.isdir(data_dir):
        return None
    files = tuple(
        (name, storage.file_state(path))
        for name in sorted(storage.listdir(data_dir))
        if storage.isfile(path := storage.join(data_dir, name))
    )
    return _digest_of(data_dir, files)


@functools.lru_cache(maxsize=8)
def _digest_of(data_dir: str, files: tuple) -> str:
    # hashed once a process for each state of the files (size, mtime): ~4 MB for Multi30k
    h = hashlib.sha256()
    for name, _ in files:
        data = storage.read_bytes(storage.join(data_dir, name))
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def _check_files(where: str, result: dict, overrides: dict) -> None:
    """A result counts only for the vocabulary and the data it was trained with (when it
    recorded their digests: results made before they did are matched by path alone)."""
    for key, what, here, fix in (
        (
            "vocab_sha256",
            "vocabulary",
            lambda: vocab_digest(overrides["data.vocab_path"]),
            "Copy the vocabulary of the sweep that made it (its mirror keeps one under vocab/)",
        ),
        (
            "data_sha256",
            "data",
            lambda: data_digest(overrides.get("data.dir")),
            "Point --data_dir at the files it was trained on",
        ),
    ):
        recorded = result.get(key)
        if not recorded:
            continue
        mine = here()
        if mine and recorded != mine:
            raise SystemExit(
                f"{where}/result.json was trained with the {what} of sha256 {recorded}, but "
                f"this sweep's is {mine}: its rows would be compared on other {what}. {fix}, "
                "or pass another --root"
            )


def _read_result(workdir: str, overrides: dict, mirror_dir: str | None = None) -> dict | None:
    """A finished run's result.json (from the workdir, else from its mirror), checked to be
    this experiment's and of this vocabulary; None when it is not finished."""
    for where in (workdir, mirror_dir):
        if where is None:
            continue
        result_path = storage.join(where, "result.json")
        if storage.exists(result_path):
            result = json.loads(storage.read_text(result_path))
            _check_same_run(where, result["overrides"], overrides)
            _check_files(where, result, overrides)
            return result
    return None


def mirror_path(mirror: str | None, root: str, workdir: str) -> str | None:
    if not mirror:
        return None
    return os.path.join(mirror, os.path.relpath(workdir, root))


def finished_result(
    preset: str, row: str, seed: int, root: str, variant=None, mirror=None, **kw
) -> dict | None:
    """A finished (row, seed) run's result, or None (--report_only: nothing is trained)."""
    overrides = run_overrides(preset, row, seed, root, variant=variant, **kw)
    workdir = workdir_of(root, row, seed, variant)
    return _read_result(workdir, overrides, mirror_path(mirror, root, workdir))


def run_one(
    preset: str,
    row: str,
    seed: int,
    root: str,
    env: dict | None = None,
    variant: str | None = None,
    mirror: str | None = None,
    **kw,
) -> dict:
    """Trains and evaluates one (row, seed), unless it is finished (then reads its result)."""
    workdir = workdir_of(root, row, seed, variant)
    mirror_dir = mirror_path(mirror, root, workdir)
    overrides = run_overrides(preset, row, seed, root, variant=variant, **kw)
    done = _read_result(workdir, overrides, mirror_dir)
    if done is not None:
        _mirror(workdir, mirror_dir, overrides, root, mirror)  # finished before --mirror was set
        return done
    result_path = storage.join(workdir, "result.json")
    storage.makedirs(workdir)
    started = storage.join(workdir, "harness.json")
    if storage.exists(started):
        _check_same_run(workdir, json.loads(storage.read_text(started)), overrides)
    elif variant and VARIANTS[variant].continues:
        continue_main_run(root, row, seed, workdir, overrides)
    storage.write_text(started, json.dumps(overrides, indent=2))
    t0 = time.time()
    train, log_path = train_in(row, workdir, overrides, env)
    train_s = time.time() - t0
    curve = stats.dev_curve(read_metrics(workdir))
    best = stats.best_point(curve)
    best_step = best[0] if best else None
    latest = layout.latest_step_on_disk(workdir)
    scores = evaluate(workdir, "latest", log_path, env)
    at_best = scores
    if best_step is not None and best_step != latest:
        at_best = evaluate(workdir, str(best_step), log_path, env)
    _keep_only(workdir, {best_step, latest})
    eval_s = time.time() - t0 - train_s
    result = {
        "row": row,
        "seed": int(seed),
        "variant": variant,
        "overrides": overrides,
        # the latest checkpoint's PPL (the report takes the best's from the curve)
        "ppl": scores["ppl"],
        "bleu": at_best["bleu"],  # at the best checkpoint, as PPL
        "bleu_at": "best",
        "best_step": best_step,
        "bleu_latest": scores["bleu"],
        "ppl_best_evaluated": at_best["ppl"],
        "bleu_tok_compound": at_best.get("bleu_tok_compound"),
        # the evaluated params' size: `params --json` for this config, without its own process
        "params": scores["params"],
        "vocab_sha256": vocab_digest(overrides["data.vocab_path"]),
        "data_sha256": data_digest(overrides.get("data.dir")),
        "platform": platform_of_log(log_path),  # the sweep mixes machines: which ran this one
        "dev_curve": curve,  # (step, dev NLL) of the evaluations during training
        "plateau_step": stats.plateau_step(curve),
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "command": "python -m tfm_jax " + " ".join(train),
    }
    continued = storage.join(workdir, CONTINUED)
    if storage.exists(continued):
        result["continued_from"] = json.loads(storage.read_text(continued))
    save_log(log_path, workdir)
    # written whole (storage.write_text): a run counts as done only when its result is complete
    text = json.dumps(result, indent=2)
    storage.write_text(result_path, text)
    _mirror(workdir, mirror_dir, overrides, root, mirror)
    return result


def _mirror(workdir: str, mirror_dir, overrides: dict, root: str, mirror) -> None:
    """The run's result.json copied into the mirror with the shared vocabulary, where the mirror
    has no result for it yet: a run trained with another --mirror (or none) is mirrored by the
    next sweep that reads it."""
    copy = storage.join(mirror_dir, "result.json") if mirror_dir else None
    if copy is None or storage.exists(copy):
        return
    storage.makedirs(mirror_dir)
    storage.write_text(copy, storage.read_text(storage.join(workdir, "result.json")))
    share_vocab(overrides["data.vocab_path"], root, mirror)


CONTINUED = "continued_from.json"


def continue_main_run(root: str, row: str, seed: int, workdir: str, overrides: dict) -> None:
    """Starts a variant run that only lengthens the budget (Variant.continues) from its main
    run's final checkpoint, with the main run's metrics (its dev curve to there), when that
    checkpoint is on disk and the main run was this run but for train.num_steps: the schedule
    does not depend on train.num_steps and a resume is bitwise exact, so the result is the
    longer run's, its first part not trained twice. Otherwise it trains from step 0. Called
    before the run's harness.json is written: a copy cut off is made again from scratch."""
    main = workdir_of(root, row, seed)
    try:
        recorded = json.loads(storage.read_text(storage.join(main, "result.json")))["overrides"]
    except (OSError, ValueError, KeyError):
        return
    end = recorded.get("train.num_steps")
    same = {k: v for k, v in _substance(overrides).items() if k != "train.num_steps"}
    if _substance(recorded) != dict(same, **{"train.num_steps": end}):
        return
    if layout.latest_step_on_disk(main) != end or layout.step_incomplete_reason(
        layout.checkpoints_dir(main), end
    ):
        return
    storage.rmtree(str(layout.checkpoints_dir(workdir)))  # what a copy cut off left
    storage.copy_tree(storage.join(main, "metrics.jsonl"), storage.join(workdir, "metrics.jsonl"))
    layout.copy_step(main, workdir, end)
    storage.write_text(storage.join(workdir, CONTINUED), json.dumps({"run": main, "step": end}))
    print(f"{row} seed {seed}: continues {main} from its step {end}", flush=True)


def platform_of_log(log_path: str) -> str | None:
    """Where the run trained, from its log's header ("platform: gpu (NVIDIA H200), process 0 of
    1, ..." -> "gpu (NVIDIA H200)"), with the host's processor for a CPU run (its ISA decides
    the bf16 arithmetic); None where the log has no header."""
    found = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if "platform: " in line:
                found = line.split("platform: ", 1)[1].split(", process")[0].strip()
    if found and found.startswith("cpu"):
        found = this_cpu()
    return found


def this_cpu() -> str:
    """This host's CPU as a result's "platform" names it: its model and bf16 arithmetic."""
    return f"cpu ({host.cpu_model() or 'unknown processor'})"


def train_args(row: str, workdir: str, overrides: dict) -> list[str]:
    """The `python -m tfm_jax` arguments that train (row, seed) in `workdir` by `overrides`:
    the sweep's run and a replay of it are the one command."""
    return ["train", f"--config=configs/table3.py:{row}", f"--workdir={workdir}"] + cli_args(
        overrides
    )


def train_in(row: str, workdir: str, overrides: dict, env: dict | None) -> tuple[list[str], str]:
    """Trains `row` in `workdir` by `overrides` (the sweep's run, a replay and a machine check
    alike), its log kept in local scratch and copied into the workdir; returns the command's
    arguments and the log's local path."""
    log_path = local_log(workdir)
    args = train_args(row, workdir, overrides)
    run_cmd(args, log_path, env)
    save_log(log_path, workdir)
    return args, log_path


def evaluate(workdir: str, checkpoint: str, log_path: str, env: dict | None) -> dict:
    args = ["evaluate", f"--workdir={workdir}", "--split=validation", f"--checkpoint={checkpoint}"]
    return json.loads(run_cmd(args, log_path, env))


def _keep_only(workdir: str, steps: set) -> None:
    """Deletes the run's checkpoints other than `steps` (the best and the latest)."""
    for step in layout.existing_steps(workdir):
        if step not in steps:
            storage.rmtree(storage.join(str(layout.checkpoints_dir(workdir)), str(step)))


def legacy_results(root: str, rows: list[str]) -> list[str]:
    """Result files of the old single-seed layout under `root` (read by nothing here)."""
    found = (storage.join(root, r, "result.json") for r in rows)
    return [p for p in found if storage.exists(p)]
