"""Dev BLEU at the best checkpoint for the runs that did not keep it.

The protocol reads dev PPL at a run's best checkpoint (its lowest dev evaluation) and dev BLEU at
that same checkpoint. Runs from before the explanation sweep kept only their latest checkpoint,
so where their best was not their latest the report has the latest's BLEU (marked †). A replay
trains such a run again, by its own settings, to its best step only, in
<root>/replays/<ROW>/seed<K>/, and evaluates that checkpoint:

    python -m experiments.table3 --preset=small --steps=1200 --rows=D0.0 --seeds=0,1 --bleu_at_best

A run is a function of its settings and of the machine's arithmetic (the schedule does not
depend on train.num_steps, the batches are the seed's, evaluations change nothing), so the replay
is the run's first part only if its dev curve is the recorded one at every evaluation up to the
best step. It is taken only then (relative PPL difference at most TOLERANCE at each): the
result.json, in the root and in the mirror, gets the best checkpoint's BLEU ("bleu_at": "best")
with the latest's kept as "bleu_latest", and "replayed" records the check. A replay whose curve
differs (another processor's bf16 arithmetic, or code changed since the run) stops at the first
evaluation where it does, and the sweep prints by how much; the result keeps its BLEU and gets
"replay_refused" (that check), which the report lists beside the dagger and which keeps a
machine of the same kind from trying again. A run recorded on another CPU model (or without
bf16 where this one has it, or the reverse) is not replayed at all. The replay's checkpoint is
kept.
"""

from __future__ import annotations

import json
import math

from experiments.table3 import stats
from experiments.table3.commands import save_log
from experiments.table3.presets import run_overrides
from experiments.table3.runner import (
    evaluate,
    finished_result,
    mirror_path,
    platform_of_log,
    this_cpu,
    train_in,
    workdir_of,
)
from tfm_jax.platform import storage
from tfm_jax.viz.curves import read_metrics

TOLERANCE = 1e-6  # relative dev PPL difference: a bitwise replay agrees to float rounding


def best_to_replay(result: dict) -> int | None:
    """The best step of a run whose BLEU is not its best checkpoint's; None when it is."""
    if stats.bleu_checkpoint(result) != "latest":
        return None
    return stats.best_point(result["dev_curve"])[0]


def curve_difference(recorded: list, replayed: list, upto: int) -> float | None:
    """The largest relative dev PPL difference between the two curves at the recorded curve's
    evaluations up to step `upto`; None where the replay lacks one of them."""
    mine = {int(s): float(v) for s, v in replayed}
    worst = 0.0
    for step, nll in recorded:
        if int(step) <= upto:
            if int(step) not in mine:
                return None
            worst = max(worst, abs(math.expm1(mine[int(step)] - float(nll))))
    return worst


def bleu_at_best(
    preset: str, row: str, seed: int, root: str, env=None, mirror=None, **kw
) -> dict | None:
    """The finished (row, seed) result, with its BLEU at the best checkpoint by a replay where
    it had the latest's and the replay matches; None when the run is not finished."""
    result = finished_result(preset, row, seed, root, mirror=mirror, **kw)
    step = None if result is None else best_to_replay(result)
    if step is None:
        return result
    here, there = this_cpu(), result.get("platform")
    if there and there.startswith("cpu (") and there != here:
        print(
            f"{row} seed {seed}: trained on {there}, and this machine is {here}: a replay here "
            "would not be the run (bf16 rounds otherwise); its BLEU stays the latest's",
            flush=True,
        )
        return result
    refused = result.get("replay_refused") or {}
    if refused.get("platform") == here:
        print(
            f"{row} seed {seed}: its replay on this kind of machine ({here}) was not the run "
            f"({refused.get('max_relative_ppl_difference'):.1e} relative off at step "
            f"{refused.get('step')}); its BLEU stays the latest's (delete its replay_refused to "
            "try again)",
            flush=True,
        )
        return result
    workdir = storage.join(root, "replays", row, f"seed{seed}")
    storage.makedirs(workdir)
    # First to the run's first evaluation, where a replay that is not the run shows (measured:
    # 0.2% and 1.8% off at step 120), then on to the best step from that checkpoint (a resume
    # is bitwise exact), so a replay that cannot count costs one evaluation's steps, not all.
    first = int(result["dev_curve"][0][0])
    for upto in sorted({min(first, step), step}):
        overrides = dict(run_overrides(preset, row, seed, root, **kw), **{"train.num_steps": upto})
        train, log_path = train_in(row, workdir, overrides, env)
        off = curve_difference(result["dev_curve"], stats.dev_curve(read_metrics(workdir)), upto)
        check = {
            "step": upto,
            "max_relative_ppl_difference": off,
            "platform": platform_of_log(log_path),
            "command": "python -m tfm_jax " + " ".join(train),
        }
        if off is None or off > TOLERANCE:
            print(
                f"{row} seed {seed}: the replay to step {upto} is not the run (dev PPL differs "
                f"by {'an evaluation missing' if off is None else f'{off:.1e} relative'}, over "
                f"{TOLERANCE:g}: another processor's arithmetic, or changed code); its BLEU "
                "stays the latest's",
                flush=True,
            )
            if off is None:
                return result
            # kept: the report says why the dagger stays, and this kind of machine skips it
            return _write(dict(result, replay_refused=check), root, mirror, row, seed)
    scores = evaluate(workdir, "latest", log_path, env)
    save_log(log_path, workdir)
    updated = dict(
        result,
        bleu=scores["bleu"],
        bleu_at="best",
        best_step=step,
        bleu_latest=result["bleu"],
        ppl_best_evaluated=scores["ppl"],
        bleu_tok_compound=scores.get("bleu_tok_compound"),
        replayed=check,
    )
    updated.pop("replay_refused", None)
    return _write(updated, root, mirror, row, seed)


def _write(result: dict, root: str, mirror, row: str, seed: int) -> dict:
    """`result` written over the run's result.json, in the root and in the mirror."""
    text = json.dumps(result, indent=2)
    main = workdir_of(root, row, seed)
    for where in (main, mirror_path(mirror, root, main)):
        if where and storage.exists(storage.join(where, "result.json")):
            storage.write_text(storage.join(where, "result.json"), text)
    return result
