"""One (row, seed) run of the Table 3 sweep: in its own workdir <root>/<ROW>/seed<K>/, `python
-m tfm_jax train`, then `evaluate --split=validation --checkpoint=latest` (dev perplexity and dev
BLEU with beam search and no checkpoint averaging, as the paper does for Table 3) and `params`.

A (row, seed) whose result.json exists is not rerun (the result is the cache); an interrupted
one resumes from its newest checkpoint. A workdir continues only the experiment it was started
for: its harness.json records the overrides, and other settings are refused.
"""

from __future__ import annotations

import json
import os
import time

from experiments.table3 import stats
from experiments.table3.commands import local_log, run_cmd, save_log
from experiments.table3.presets import cli_args, run_overrides
from tfm_jax.platform import storage
from tfm_jax.viz.curves import read_metrics

# Overrides that change how often a run logs, evaluates or saves, not what it learns: a finished
# or half-finished run may be continued under other values of these.
CADENCE_KEYS = (
    "train.log_every_steps",
    "train.eval_every_steps",
    "train.checkpoint_every_steps",
    "train.checkpoint_every_secs",
    "train.keep_checkpoints",
)


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
    curve = stats.dev_curve(read_metrics(workdir))
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


def legacy_results(root: str, rows: list[str]) -> list[str]:
    """Result files of the old single-seed layout under `root` (read by nothing here)."""
    found = (storage.join(root, r, "result.json") for r in rows)
    return [p for p in found if storage.exists(p)]
