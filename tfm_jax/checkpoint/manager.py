"""Checkpoints (§5, §6): Orbax manager, 10-minute saves, checkpoint averaging.

Layout of a run's workdir::

  <workdir>/checkpoints/<step>/   one Orbax checkpoint per save, items:
      state/    the TrainState (StandardSave; restored into the caller's shardings)
      data/     the data iterator's position (JSON)
      config/   the run's config (JSON)
  <workdir>/averaged/             written by `average_checkpoints`, items:
      params/   element-wise mean of the params of the last N checkpoints
      meta/     {"steps": [...], "source": ...} (JSON)
      config/   the config of the newest averaged checkpoint (JSON)

Crash safety: Orbax writes every checkpoint into `<step>.orbax-checkpoint-tmp-<ts>/`, writes
`commit_success.txt` and renames it to `<step>/` only when every item is written (on GCS,
where rename is not atomic, the commit file alone marks completion). A kill mid-save therefore
leaves a tmp directory that Orbax never lists as a step and deletes when the next manager
opens the directory. On top of that, `Checkpointer.restore_latest` checks the commit marker
itself and falls back to the previous checkpoint when the newest one fails to restore
(a truncated or deleted file), so a damaged newest checkpoint costs one save interval, not
the run.
"""

from __future__ import annotations

import functools
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from tfm_jax.config import paths

PyTree = Any
ConfigJson = str | Mapping[str, Any]

CHECKPOINTS_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
_STATE, _DATA, _CONFIG = "state", "data", "config"
_PARAMS, _META = "params", "meta"
# Orbax's per-checkpoint completion marker (written just before the atomic rename).
_COMMIT_FILE = ocp.path.atomicity.COMMIT_SUCCESS_FILE
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


class NonFiniteStateError(ValueError):
    """Raised instead of saving a state whose params contain NaN or Inf."""


class CheckpointNotFoundError(FileNotFoundError):
    """The requested checkpoint does not exist in the workdir."""


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the directory could be restored."""


class AveragedCheckpoint(NamedTuple):
    path: str  # <workdir>/averaged
    steps: list[int]  # the steps whose params were averaged, ascending


# ----------------------------------------------------------------------------- helpers


def _checkpoints_dir(workdir: str | epath.Path) -> epath.Path:
    # Orbax refuses relative paths; the CLI resolves them, library callers may not have.
    return epath.Path(paths.resolve(str(workdir))) / CHECKPOINTS_DIR


def _averaged_dir(workdir: str | epath.Path) -> epath.Path:
    return epath.Path(paths.resolve(str(workdir))) / AVERAGED_DIR


def _config_to_json_obj(config_json: ConfigJson) -> Any:
    """Validates the config now (not in Orbax's background thread) and returns a JSON value."""
    if isinstance(config_json, str):
        try:
            return json.loads(config_json)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"config_json must be JSON text (as from cfg.to_json()) or a dict; got {e}"
            ) from e
    try:
        return json.loads(json.dumps(dict(config_json)))
    except TypeError as e:
        raise TypeError(f"config_json is not JSON-serializable: {e}") from e


def _check_json(data_state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(data_state, Mapping):
        raise TypeError(f"data_state must be a dict, got {type(data_state).__name__}")
    try:
        json.dumps(data_state)
    except TypeError as e:
        raise TypeError(f"data_state is not JSON-serializable: {e}") from e
    return dict(data_state)


@jax.jit
def _nonfinite_leaves(params: PyTree) -> PyTree:
    """One bool per floating leaf: True where the leaf holds a NaN or Inf."""
    return jax.tree.map(
        lambda x: (
            ~jnp.all(jnp.isfinite(x))
            if jnp.issubdtype(x.dtype, jnp.inexact)
            else jnp.zeros((), bool)
        ),
        params,
    )


def _raise_if_nonfinite(params: PyTree, step: int) -> None:
    flags = jax.device_get(_nonfinite_leaves(params))
    bad = [
        jax.tree_util.keystr(path)
        for path, flag in jax.tree_util.tree_flatten_with_path(flags)[0]
        if bool(flag)
    ]
    if bad:
        shown = ", ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
        raise NonFiniteStateError(
            f"Refusing to save step {step}: params contain NaN/Inf in {shown}. The previous "
            "checkpoints are untouched; restart from them (maybe with a lower learning rate)."
        )


def _uncommitted_reason(step_dir: epath.Path, items: Sequence[str]) -> str | None:
    """Why `step_dir` is not a complete checkpoint, or None if it looks complete.

    Orbax only lists renamed (local) or commit-marked (GCS) directories, but a directory can
    still lose its marker or items afterwards (a partial copy, a manual edit), so check.
    """
    if not step_dir.is_dir():
        return "directory is missing"
    if not (step_dir / _COMMIT_FILE).exists():
        # Older Orbax versions mark completion only in the step metadata.
        try:
            meta = json.loads((step_dir / _STEP_METADATA_FILE).read_text())
        except (OSError, ValueError):
            meta = {}
        if not meta.get("commit_timestamp_nsecs"):
            return f"no commit marker ({_COMMIT_FILE}): the save did not finish"
    missing = [name for name in items if not (step_dir / name).is_dir()]
    if missing:
        return f"item(s) {missing} missing"
    return None


def _with_default_shardings(abstract: PyTree) -> PyTree:
    """Leaves without `.sharding` are restored onto the first local device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def fix(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or device)

    return jax.tree.map(fix, abstract)


def _all_processes_ok(ok: bool) -> bool:
    """All hosts must take the same branch, or the next collective hangs."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def _read_only_manager(workdir: str | epath.Path) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        _checkpoints_dir(workdir),
        item_names=(_STATE, _DATA, _CONFIG),
        options=ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0),
    )


def _existing_steps(workdir: str | epath.Path) -> list[int]:
    if not _checkpoints_dir(workdir).is_dir():
        return []
    with _read_only_manager(workdir) as mngr:
        return sorted(mngr.all_steps())


def latest_step_on_disk(workdir: str | epath.Path) -> int | None:
    """The newest step Orbax lists in the workdir, complete or not (None if there is none)."""
    steps = _existing_steps(workdir)
    return steps[-1] if steps else None


def _restore_params_from_step(
    workdir: str | epath.Path, step: int, abstract_params: PyTree
) -> PyTree:
    """Reads only `state.params` of one checkpoint (the optimizer state stays on disk)."""
    abstract = {"params": _with_default_shardings(abstract_params)}
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(
            _checkpoints_dir(workdir) / str(step) / _STATE,
            args=ocp.args.PyTreeRestore(
                item=abstract,
                restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                partial_restore=True,
            ),
        )
    return restored["params"]


def _not_found(workdir: str | epath.Path, which: str, why: str) -> CheckpointNotFoundError:
    steps = _existing_steps(workdir)
    avg = _averaged_dir(workdir)
    exists = (
        f"checkpoints at steps {steps} exist under {_checkpoints_dir(workdir)}"
        if steps
        else f"there are no checkpoints under {_checkpoints_dir(workdir)}"
    )
    exists += "; an averaged checkpoint exists" if avg.is_dir() else "; no averaged checkpoint"
    return CheckpointNotFoundError(
        f"No checkpoint {which!r} in workdir {workdir}: {why}. {exists}. Pass which='latest', "
        "'averaged' or a step number; create an averaged checkpoint with "
        f"`python -m tfm_jax average --workdir={workdir} --last=5` (§6: 5 for base, 20 for big)."
    )


def _resolve_step(workdir: str | epath.Path, which: str) -> int:
    """Maps 'latest' or '<step>' to the step of a complete checkpoint."""
    steps = _existing_steps(workdir)
    if which == "latest":
        for step in reversed(steps):
            reason = _uncommitted_reason(
                _checkpoints_dir(workdir) / str(step), (_STATE, _DATA, _CONFIG)
            )
            if reason is None:
                return step
            logging.warning("Skipping checkpoint %d in %s: %s", step, workdir, reason)
        raise _not_found(workdir, which, "no complete checkpoint")
    try:
        step = int(which)
    except ValueError:
        raise ValueError(
            f"which must be 'averaged', 'latest' or a step number, got {which!r}"
        ) from None
    if step not in steps:
        raise _not_found(workdir, which, f"step {step} was not saved (or was deleted)")
    return step


# ----------------------------------------------------------------------------- Checkpointer


class Checkpointer:
    """Saves the TrainState, data position and config every N steps and/or every T seconds.

    Paper §6: checkpoints were written at 10-minute intervals and the last 5 (base) or 20
    (big) averaged, so `keep` must be at least the `--last` used for averaging.

    `step` arguments are Python ints equal to `state.step` (updates applied to `state`); pass
    them from the host loop counter so checking whether to save never syncs with the device.
    """

    def __init__(
        self,
        workdir: str | epath.Path,
        *,
        every_steps: int,
        every_secs: float,
        keep: int,
        async_save: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        if every_steps < 0 or every_secs < 0:
            raise ValueError(
                f"every_steps ({every_steps}) and every_secs ({every_secs}) must be >= 0 "
                "(0 disables that trigger)"
            )
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints to keep), got {keep}")
        self.directory = _checkpoints_dir(workdir)
        self._every_steps = int(every_steps)
        self._every_secs = float(every_secs)
        self._clock = clock
        self._last_save_time = clock()
        self._mngr = ocp.CheckpointManager(
            self.directory,
            item_names=(_STATE, _DATA, _CONFIG),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                # We decide when to save (time-based as well) and pass force=True.
                save_interval_steps=1,
                enable_async_checkpointing=async_save,
                # Deletes `<step>.orbax-checkpoint-tmp-*` dirs left by a killed save.
                cleanup_tmp_directories=True,
                create=True,
            ),
        )

    # -- queries

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def should_save(self, step: int) -> bool:
        """The step/time triggers alone (no check for an existing checkpoint)."""
        by_steps = self._every_steps > 0 and step % self._every_steps == 0
        by_time = False
        if self._every_secs > 0:
            by_time = self._clock() - self._last_save_time >= self._every_secs
            if jax.process_count() > 1:
                # Hosts' clocks differ; all must agree or Orbax's save barrier hangs.
                by_time = bool(multihost_utils.broadcast_one_to_all(np.asarray(by_time)))
        return by_steps or by_time

    def reached_preemption(self, step: int) -> bool:
        """True at the step every host agreed to save at after one of them got SIGTERM.

        Multi-host only: JAX's preemption service (started by jax.distributed.initialize)
        catches SIGTERM on any host and picks a step all hosts reach; Orbax asks it here.
        """
        return jax.process_count() > 1 and bool(self._mngr.reached_preemption(step))

    # -- saving

    def maybe_save(
        self,
        step: int,
        state: PyTree,
        data_state: Mapping[str, Any],
        config_json: ConfigJson,
        *,
        force: bool = False,
    ) -> bool:
        """Saves if a trigger fires or `force`; returns whether a save was started.

        Raises NonFiniteStateError (and saves nothing) if `state.params` holds NaN/Inf.
        A step that already has a checkpoint is not saved again (returns False), so a forced
        save at the end of training may follow a periodic save of the same step.
        With async_save the call returns once the arrays are copied off the device; the
        files are written in the background (see `wait`).
        """
        step = int(step)
        if not (force or self.should_save(step)):
            return False
        if step in self._mngr.all_steps():
            logging.info("Checkpoint for step %d already exists in %s", step, self.directory)
            return False
        data_state = _check_json(data_state)
        config = _config_to_json_obj(config_json)
        _raise_if_nonfinite(state.params, step)
        saved = self._mngr.save(
            step,
            args=ocp.args.Composite(
                **{
                    _STATE: ocp.args.StandardSave(state),
                    _DATA: ocp.args.JsonSave(data_state),
                    _CONFIG: ocp.args.JsonSave(config),
                }
            ),
            force=True,
        )
        self._last_save_time = self._clock()
        if saved:
            logging.info("Saving checkpoint for step %d in %s", step, self.directory)
        return bool(saved)

    def wait(self) -> None:
        """Blocks until an in-flight async save is on disk."""
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """Waits for in-flight saves and releases Orbax's threads."""
        self._mngr.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- restoring

    def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any], int] | None:
        """Restores the newest complete checkpoint into `abstract_state`'s shardings.

        Returns (state, data_state, step), or None if there is no checkpoint. A newest
        checkpoint that is incomplete or fails to restore is skipped with a warning and, once
        an older one restores, moved aside to `<step>.corrupt-<time>` (kept for inspection)
        so the rerun can save that step again. If no checkpoint restores (e.g. the model
        changed so that `abstract_state` no longer matches), nothing is moved and
        CheckpointRestoreError is raised.
        """
        self._mngr.wait_until_finished()
        self._mngr.reload()
        abstract_state = _with_default_shardings(abstract_state)
        failed: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            reason = _uncommitted_reason(self.directory / str(step), (_STATE, _DATA, _CONFIG))
            restored = None
            if reason is None:
                try:
                    restored = self._mngr.restore(
                        step,
                        args=ocp.args.Composite(
                            **{
                                _STATE: ocp.args.StandardRestore(abstract_state),
                                _DATA: ocp.args.JsonRestore(),
                            }
                        ),
                    )
                except Exception as e:  # Orbax/TensorStore raise many kinds
                    reason = f"restore failed: {type(e).__name__}: {e}"
            if not _all_processes_ok(reason is None):
                reason = reason or "restore failed on another host"
                logging.warning(
                    "Skipping checkpoint %d in %s (%s); trying the previous one",
                    step,
                    self.directory,
                    reason,
                )
                failed.append((step, reason))
                continue
            self._quarantine([s for s, _ in failed])
            if failed:
                logging.warning("Restored step %d instead of the newest %d", step, failed[0][0])
            else:
                logging.info("Restored checkpoint for step %d from %s", step, self.directory)
            return restored[_STATE], dict(restored[_DATA]), step
        if failed:
            details = "; ".join(f"step {s}: {r}" for s, r in failed)
            raise CheckpointRestoreError(
                f"No checkpoint in {self.directory} could be restored ({details}). If the "
                "model or optimizer config changed, restore with the original config; if the "
                f"checkpoints are damaged, move them aside (`mv {self.directory} "
                f"{self.directory}.damaged`) and rerun to start from scratch."
            )
        return None

    def _quarantine(self, steps: Sequence[int]) -> None:
        if not steps:
            return
        if jax.process_index() == 0:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for step in steps:
                src = self.directory / str(step)
                if src.exists():
                    dst = self.directory / f"{step}.corrupt-{stamp}"
                    logging.warning("Moving damaged checkpoint %s to %s", src, dst)
                    src.rename(dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("tfm_jax.checkpoint.quarantine")
        self._mngr.reload()


# ----------------------------------------------------------------------------- averaging


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
    checkpoints exist: averaging fewer would silently change the §6 protocol.
    Overwrites an existing `<workdir>/averaged`.
    """
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    steps = [
        s
        for s in _existing_steps(workdir)
        if _uncommitted_reason(_checkpoints_dir(workdir) / str(s), (_STATE,)) is None
    ]
    if len(steps) < last:
        raise ValueError(
            f"Asked to average the last {last} checkpoints but only {len(steps)} complete "
            f"ones exist in {_checkpoints_dir(workdir)} (steps {steps}). Pass --last="
            f"{len(steps)} or train with checkpoint keep >= {last}."
        )
    steps = steps[-last:]
    abstract_params = _with_default_shardings(abstract_params)

    acc = None
    for step in steps:
        try:
            params = _restore_params_from_step(workdir, step, abstract_params)
        except Exception as e:  # Orbax/TensorStore raise many kinds
            raise CheckpointRestoreError(
                f"Could not read the params of step {step} in {_checkpoints_dir(workdir)} "
                f"({type(e).__name__}: {e}). Check that abstract_params matches the run's "
                "config; if the checkpoint is damaged, move it aside and average fewer."
            ) from e
        if acc is None:
            acc = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        else:
            with warnings.catch_warnings():
                # CPU cannot donate; harmless there, saves a copy on accelerators.
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                acc = _accumulate(acc, params)
        del params
    dtypes = jax.tree.map(lambda x: x.dtype, abstract_params)
    shardings = jax.tree.map(lambda x: x.sharding, abstract_params)
    finish = jax.jit(
        lambda acc: jax.tree.map(lambda a, d: (a / len(steps)).astype(d), acc, dtypes),
        out_shardings=shardings,
    )
    averaged = finish(acc)
    del acc

    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        config = ckptr.restore(
            _checkpoints_dir(workdir) / str(steps[-1]),
            args=ocp.args.Composite(**{_CONFIG: ocp.args.JsonRestore()}),
        )[_CONFIG]
    path = _averaged_dir(workdir)
    meta = {"steps": steps, "source": str(_checkpoints_dir(workdir))}
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(
            path,
            args=ocp.args.Composite(
                **{
                    _PARAMS: ocp.args.StandardSave(averaged),
                    _META: ocp.args.JsonSave(meta),
                    _CONFIG: ocp.args.JsonSave(config),
                }
            ),
            force=True,  # replace an older average
        )
    logging.info("Averaged params of steps %s into %s", steps, path)
    return AveragedCheckpoint(str(path), steps)


# ----------------------------------------------------------------------------- reading


def load_params(workdir: str | epath.Path, which: str, abstract_params: PyTree) -> PyTree:
    """Params of `which` checkpoint: 'averaged', 'latest' or a step number (as a string).

    Restored into `abstract_params`' shardings. 'latest' skips incomplete checkpoints with a
    warning. Raises CheckpointNotFoundError saying what exists if `which` does not.
    """
    which = str(which)
    if which == "averaged":
        path = _averaged_dir(workdir)
        if _uncommitted_reason(path, (_PARAMS,)) is not None:
            raise _not_found(workdir, which, f"{path} does not exist or is incomplete")
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
            restored = ckptr.restore(
                path,
                args=ocp.args.Composite(
                    **{_PARAMS: ocp.args.StandardRestore(_with_default_shardings(abstract_params))}
                ),
            )
        return restored[_PARAMS]
    step = _resolve_step(workdir, which)
    logging.info("Loading params of step %d from %s", step, workdir)
    return _restore_params_from_step(workdir, step, abstract_params)


def read_averaged_steps(workdir: str | epath.Path) -> list[int]:
    """The steps that `<workdir>/averaged` averages."""
    path = _averaged_dir(workdir)
    if _uncommitted_reason(path, (_META,)) is not None:
        raise _not_found(workdir, "averaged", f"{path} does not exist or is incomplete")
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        meta = ckptr.restore(path, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))
    return list(meta[_META]["steps"])


def read_config_json(workdir: str | epath.Path, which: str = "latest") -> dict[str, Any]:
    """The run's config (as a dict) stored with `which` checkpoint (see `load_params`).

    Rebuild it with `ml_collections.ConfigDict(read_config_json(workdir))`.
    """
    which = str(which)
    if which == "averaged":
        path = _averaged_dir(workdir)
        if _uncommitted_reason(path, (_CONFIG,)) is not None:
            raise _not_found(workdir, which, f"{path} does not exist or is incomplete")
    else:
        path = _checkpoints_dir(workdir) / str(_resolve_step(workdir, which))
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        restored = ckptr.restore(path, args=ocp.args.Composite(**{_CONFIG: ocp.args.JsonRestore()}))
    return restored[_CONFIG]
