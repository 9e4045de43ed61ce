"""Saves, restores and resumes a run's checkpoints: TrainState, data position and config (§5).

Crash safety: Orbax writes every checkpoint into `<step>.orbax-checkpoint-tmp-<ts>/` and renames
it to `<step>/` only when every item is written (on GCS, where rename is not atomic, a commit
file marks completion). A kill mid-save therefore leaves a tmp directory that Orbax never lists
as a step and deletes when the next manager opens the directory. On top of that,
`Checkpointer.restore_latest` checks each step's commit record itself and falls back to the
previous checkpoint when the newest one fails to restore (a truncated or deleted file), moving
the damaged one aside, so a damaged newest checkpoint costs one save interval, not the run.
The workdir's layout is described in layout.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from tfm_jax.checkpoint import agreement, debris, layout, reading, room
from tfm_jax.checkpoint.errors import (
    CheckpointRestoreError,
    CheckpointSaveError,
    NonFiniteStateError,
)
from tfm_jax.checkpoint.layout import CONFIG, DATA, STATE
from tfm_jax.platform import storage

log = logging.getLogger(__name__)


def resume_text(newest: int | None, full: bool) -> str:
    """The end of a failed save's message: the newest complete checkpoint and how to go on."""
    newest_text = (
        f"The newest complete checkpoint is still step {newest}"
        if newest is not None
        else "No complete checkpoint was saved before it"
    )
    fix = "Free space on that filesystem (or move the workdir)" if full else "Fix that"
    resume = f"resume from step {newest}" if newest is not None else "start again"
    return f"{newest_text}. {fix}, then run the same command to {resume}"


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


PyTree = Any
ConfigJson = str | Mapping[str, Any]


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


def _all_processes_ok(ok: bool) -> bool:
    """All hosts must take the same branch, or the next collective hangs."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


# ----------------------------------------------------------------------------- Checkpointer


class Checkpointer:
    """Saves the TrainState, data position and config every N steps and/or every T seconds.

    Paper §6: checkpoints were written at 10-minute intervals and the last 5 (base) or 20
    (big) averaged, so `keep` must be at least the `--last` used for averaging. Steps that are
    multiples of `keep_period` (if > 0) are kept as well, beyond the newest `keep`.

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
        keep_period: int = 0,
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
        if keep_period < 0:
            raise ValueError(
                f"keep_period must be >= 0 (0: just the newest `keep`), got {keep_period}"
            )
        self.directory = layout.checkpoints_dir(workdir)
        self._every_steps = int(every_steps)
        self._every_secs = float(every_secs)
        self._clock = clock
        self._last_save_time = clock()
        self._mngr = ocp.CheckpointManager(
            self.directory,
            item_names=layout.CHECKPOINT_ITEMS,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                # and every checkpoint whose step is a multiple of keep_period, however old
                keep_period=keep_period or None,
                # We decide when to save (time-based as well) and pass force=True.
                save_interval_steps=1,
                enable_async_checkpointing=async_save,
                # Deletes `<step>.orbax-checkpoint-tmp-*` dirs left by a killed save.
                cleanup_tmp_directories=True,
                create=True,
                # several hosts: barriers that give up when one host's write failed
                async_options=ocp.AsyncOptions(barrier_sync_fn=agreement.barrier_sync_fn()),
            ),
        )
        self._committed = self._mngr.latest_step()  # newest checkpoint known to be on disk
        self._pending: int | None = None  # the step of a save still being written
        self._state_bytes = 0  # the last state saved, uncompressed, all hosts' shards once
        self._failure: CheckpointSaveError | None = None

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
            log.info("Checkpoint for step %d already exists in %s", step, self.directory)
            return False
        data_state = _check_json(data_state)
        config = _config_to_json_obj(config_json)
        _raise_if_nonfinite(state.params, step)
        if self._failure is not None:
            raise self._failure
        self.wait()  # the previous save's error, if any, is that save's (Orbax would raise it here)
        short = room.shortfall(self.directory, step, self._committed, state)
        if short:  # on every host alike, before any of them writes
            self._failure = CheckpointSaveError(short + resume_text(self._committed, full=True))
            raise self._failure
        self._state_bytes = room.state_bytes(state)
        debris.install()  # an async save's threads print a failure before wait() reports it
        with self._saving(step):
            saved = self._mngr.save(
                step,
                args=ocp.args.Composite(
                    **{
                        STATE: ocp.args.StandardSave(state),
                        DATA: ocp.args.JsonSave(data_state),
                        CONFIG: ocp.args.JsonSave(config),
                    }
                ),
                force=True,
            )
        self._last_save_time = self._clock()
        if saved:
            self._pending = step
            log.info("Saving checkpoint for step %d in %s", step, self.directory)
        return bool(saved)

    def wait(self) -> None:
        """Blocks until an in-flight async save is on disk.

        A save that failed (a full disk, an I/O error) raises CheckpointSaveError here, once;
        after that, waiting is a no-op so that cleanup on the way out does not raise again.
        """
        if self._failure is not None:
            return
        with self._saving(self._pending):
            self._mngr.wait_until_finished()
        if self._pending is not None:
            self._committed, self._pending = self._pending, None

    def close(self) -> None:
        """Waits for in-flight saves and releases Orbax's threads."""
        if self._failure is None:
            self.wait()
        try:
            self._mngr.close()
        except Exception:  # noqa: BLE001 - the failed save was reported by wait()/maybe_save()
            if self._failure is None:
                raise

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _saving(self, step: int | None):
        """Turns a failed write of checkpoint `step` into one CheckpointSaveError (see wait)."""
        try:
            yield
        except Exception as e:  # TensorStore, Orbax and the OS raise many kinds
            self._failure = self._save_error(step, e)
            self._remove_partial(step)
            raise self._failure from None

    def _save_error(self, step: int | None, e: BaseException) -> CheckpointSaveError:
        e = agreement.original_error(e)
        text = str(e)
        full = storage.is_disk_full(e) or any(
            s in text for s in ("No space left", "os_error_code='28'", "Disk quota")
        )
        what = "no space left on the device" if full else reading.read_error_reason(e)
        elsewhere = isinstance(e, agreement.SaveFailedOnAHost)
        if elsewhere:
            what = str(e)  # another host's error, as it said it: this host's disk is not it
        space = ""
        if full and self._state_bytes and not elsewhere:
            space = f"; the train state is {_megabytes(self._state_bytes)} uncompressed"
            if (free := storage.free_bytes(self.directory)) is not None:
                space += f", {_megabytes(free)} are free there"
        committed = self._mngr.all_steps() if self._failure is None else []
        newest = max([s for s in committed if s != step], default=self._committed)
        return CheckpointSaveError(
            f"checkpoint {step if step is not None else ''} could not be saved in "
            f"{self.directory} ({what}{space}); training stopped. {resume_text(newest, full)}"
        )

    def disk_full_error(self, e: OSError) -> CheckpointSaveError:
        """The error to stop with when a write beside the checkpoints (metrics.jsonl) found the
        disk full, naming the newest complete checkpoint once the save in flight has ended (a
        save that failed too raises its own CheckpointSaveError here instead)."""
        self.wait()
        where = f" writing {e.filename}" if e.filename else ""
        return CheckpointSaveError(
            f"no space left on the device{where} ({e.strerror}); training stopped. "
            + resume_text(self.latest_step(), full=True)
        )

    def _remove_partial(self, step: int | None) -> None:
        """Deletes the failed save's `<step>.orbax-checkpoint-tmp*` folder (frees the space; Orbax
        never lists it as a step) on process 0."""
        if step is None or jax.process_index() != 0:
            return
        try:
            for name in storage.listdir(self.directory):
                if name.startswith(f"{step}.orbax-checkpoint-tmp"):
                    storage.rmtree(storage.join(str(self.directory), name))
        except Exception as e:  # noqa: BLE001 - a next run's manager deletes it too
            log.info("Could not remove the partial checkpoint %d yet: %s", step, e)

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
        abstract_state = layout.with_default_shardings(abstract_state)
        failed: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            reason = layout.step_incomplete_reason(self.directory, step)
            restored = None
            if reason is None:
                try:
                    restored = self._mngr.restore(
                        step,
                        args=ocp.args.Composite(
                            **{
                                STATE: ocp.args.StandardRestore(abstract_state),
                                DATA: ocp.args.JsonRestore(),
                            }
                        ),
                    )
                except Exception as e:  # Orbax/TensorStore raise many kinds
                    reason = f"restore failed: {type(e).__name__}: {e}"
            if not _all_processes_ok(reason is None):
                reason = reason or "restore failed on another host"
                log.warning(
                    "Skipping checkpoint %d in %s (%s); trying the previous one",
                    step,
                    self.directory,
                    reason,
                )
                failed.append((step, reason))
                continue
            self._quarantine([s for s, _ in failed])
            if failed:
                log.warning("Restored step %d instead of the newest %d", step, failed[0][0])
            else:
                log.info("Restored checkpoint for step %d from %s", step, self.directory)
            return restored[STATE], dict(restored[DATA]), step
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
                    log.warning("Moving damaged checkpoint %s to %s", src, dst)
                    src.rename(dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("tfm_jax.checkpoint.quarantine")
        self._mngr.reload()
