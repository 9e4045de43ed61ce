"""The paper's checkpoint averaging (§6): the mean params of a run's last N checkpoints.

The average is written to `<workdir>/averaged/` (see layout.py) and read back with
`reading.load_params(workdir, "averaged", ...)`.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from tfm_jax.checkpoint import debris, layout, reading
from tfm_jax.checkpoint.errors import CheckpointRestoreError
from tfm_jax.checkpoint.layout import CONFIG, META, PARAMS, STATE

log = logging.getLogger(__name__)

PyTree = Any


class AveragedCheckpoint(NamedTuple):
    path: str  # <workdir>/averaged
    steps: list[int]  # the steps whose params were averaged, ascending


@functools.partial(jax.jit, donate_argnums=0)
def _accumulate(acc: PyTree, params: PyTree) -> PyTree:
    return jax.tree.map(lambda a, p: a + p.astype(jnp.float32), acc, params)


def average_checkpoints(
    workdir: str | epath.Path, last: int, abstract_params: PyTree
) -> AveragedCheckpoint:
    """Averages the params of the last `last` checkpoints into `<workdir>/averaged` (§6).

    Sums in float32 one checkpoint at a time (memory ~2x params), each restored into
    `abstract_params`' shardings so a sharded model is never gathered on one host. The mean
    is cast back to each leaf's dtype. Raises ValueError if fewer than `last` complete
    checkpoints exist: averaging fewer would silently change the §6 protocol. A checkpoint
    that cannot be read is skipped with a warning naming it and why, and the next older one
    taken instead; CheckpointRestoreError if fewer than `last` read.
    Overwrites an existing `<workdir>/averaged`.
    """
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    source = layout.checkpoints_dir(workdir)
    steps = [
        s
        for s in layout.existing_steps(workdir)
        if layout.step_incomplete_reason(source, s, (STATE,)) is None
    ]
    if len(steps) < last:
        raise ValueError(
            f"Asked to average the last {last} checkpoints but only {len(steps)} complete "
            f"ones exist in {source} (steps {steps}). Pass --last="
            f"{len(steps)} or train with checkpoint keep >= {last}."
        )
    abstract_params = layout.with_default_shardings(abstract_params)

    # Newest first, as `train` restores: a checkpoint that cannot be read (damaged files) is
    # named and skipped, and the next older one is averaged in its place, so the average is
    # still of `last` checkpoints, the newest that read. The sum's order does not matter (f32).
    acc, used, failed, config = None, [], [], None
    with layout.quiet_orbax(), layout.open_checkpoints(workdir) as mngr:
        for step in reversed(steps):
            if len(used) == last:
                break
            try:
                params = layout.restore_params(mngr, step, abstract_params)
                if config is None:
                    config = mngr.restore(
                        step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()})
                    )[CONFIG]
            except Exception as e:  # Orbax/TensorStore/JSON raise many kinds
                debris.install()  # reported here, with the step; not again
                failed.append((step, f"cannot be read ({reading.read_error_reason(e)})"))
                continue
            if acc is None:
                acc = jax.tree.map(lambda p: p.astype(jnp.float32), params)
            else:
                with warnings.catch_warnings():
                    # CPU cannot donate; harmless there, saves a copy on accelerators.
                    warnings.filterwarnings(
                        "ignore", message="Some donated buffers were not usable"
                    )
                    acc = _accumulate(acc, params)
            del params
            used.append(step)
    details = "; ".join(f"checkpoint {s} {r}" for s, r in failed)
    if len(used) < last:
        raise CheckpointRestoreError(
            f"Asked to average the last {last} checkpoints in {source} but only {len(used)} "
            f"of them read{f' (steps {sorted(used)})' if used else ''}: {details}. Pass "
            f"--last={len(used)} to average those, or restore the damaged checkpoints from a "
            "copy; if abstract_params does not match the run's config, rebuild it from the "
            "run's config.json"
        )
    if failed:
        log.warning("Averaging steps %s instead: %s", sorted(used), details)
    steps = sorted(used)
    dtypes = jax.tree.map(lambda x: x.dtype, abstract_params)
    shardings = jax.tree.map(lambda x: x.sharding, abstract_params)
    finish = jax.jit(
        lambda acc: jax.tree.map(lambda a, d: (a / len(steps)).astype(d), acc, dtypes),
        out_shardings=shardings,
    )
    averaged = finish(acc)
    del acc

    meta = {"steps": steps, "source": str(source)}
    _remove_old_average(workdir)
    with layout.open_averaged(workdir, write=True) as mngr:
        mngr.save(
            layout.AVERAGED_STEP,
            args=ocp.args.Composite(
                **{
                    PARAMS: ocp.args.StandardSave(averaged),
                    META: ocp.args.JsonSave(meta),
                    CONFIG: ocp.args.JsonSave(config),
                }
            ),
            force=True,
        )
    path = layout.averaged_dir(workdir)
    log.info("Averaged params of steps %s into %s", steps, path)
    return AveragedCheckpoint(str(path), steps)


def _remove_old_average(workdir: str | epath.Path) -> None:
    """Deletes `<workdir>/averaged`, complete or not: Orbax never overwrites a step."""
    path = layout.averaged_dir(workdir)
    if jax.process_index() == 0 and path.exists():
        path.rmtree()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("tfm_jax.checkpoint.remove_old_average")


def read_averaged_steps(workdir: str | epath.Path) -> list[int]:
    """The steps that `<workdir>/averaged` averages."""
    path = layout.averaged_dir(workdir)
    if layout.averaged_incomplete_reason(workdir, (META,)) is not None:
        raise layout.not_found(workdir, "averaged", f"{path} does not exist or is incomplete")
    with layout.open_averaged(workdir) as mngr:
        meta = mngr.restore(
            layout.AVERAGED_STEP, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()})
        )
    return list(meta[META]["steps"])
