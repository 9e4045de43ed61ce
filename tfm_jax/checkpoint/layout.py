"""Where a run's checkpoints live in its workdir, and which are complete (reading.py reads them).

Layout of a run's workdir (Orbax's on-disk format; every directory below is written and read
through an `ocp.CheckpointManager`)::

  <workdir>/checkpoints/<step>/   one checkpoint per save (see manager.py), items:
      state/    the TrainState (StandardSave; restored into the caller's shardings)
      data/     the data iterator's position (JSON)
      config/   the run's config (JSON)
  <workdir>/averaged/             written by `averaging.average_checkpoints`, items:
      params/   element-wise mean of the params of the last N checkpoints
      meta/     {"steps": [...], "source": ...} (JSON)
      config/   the config of the newest averaged checkpoint (JSON)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from tfm_jax.checkpoint.errors import CheckpointNotFoundError
from tfm_jax.config import paths
from tfm_jax.platform import storage

log = logging.getLogger(__name__)

PyTree = Any

CHECKPOINTS_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
STATE, DATA, CONFIG = "state", "data", "config"  # the items of <workdir>/checkpoints/<step>/
PARAMS, META = "params", "meta"  # with CONFIG, the items of <workdir>/averaged/
CHECKPOINT_ITEMS = (STATE, DATA, CONFIG)
AVERAGED_ITEMS = (PARAMS, META, CONFIG)
# The one step of the manager over <workdir>/averaged/ (the number is not stored on disk).
AVERAGED_STEP = 0
# What Orbax writes when a save finishes: the step's metadata, which holds its commit time (what
# `step_incomplete_reason` reads), and the commit marker (GCS) of the step and of each item.
COMMIT_RECORDS = ("_CHECKPOINT_METADATA", "commit_success.txt")


def _root(workdir: str | epath.Path) -> epath.Path:
    # Orbax refuses relative paths; the CLI resolves them, library callers may not have.
    return epath.Path(paths.resolve(str(workdir)))


def checkpoints_dir(workdir: str | epath.Path) -> epath.Path:
    return _root(workdir) / CHECKPOINTS_DIR


def averaged_dir(workdir: str | epath.Path) -> epath.Path:
    return _root(workdir) / AVERAGED_DIR


# ----------------------------------------------------------------------------- Orbax managers

# How CheckpointManager names (and lists) `<step>/` directories by default.
_STEP_NAMES = ocp.path.step.standard_name_format()


class _AveragedName(ocp.path.step.NameFormat[ocp.path.step.Metadata]):
    """The name format whose one step (AVERAGED_STEP) is `<root>/averaged/`.

    A CheckpointManager rooted at the workdir with this name format reads and writes
    `<workdir>/averaged/` as its only step, in the layout the average has always had.
    """

    def build_name(self, step: int) -> str:
        return AVERAGED_DIR

    def find_step(self, base_path: epath.PathLike, step: int) -> ocp.path.step.Metadata:
        path = epath.Path(base_path) / AVERAGED_DIR
        if step != AVERAGED_STEP or not path.is_dir() or not ocp.path.step.is_path_finalized(path):
            raise ValueError(f"No averaged checkpoint (step {step}) at {path}")
        return ocp.path.step.Metadata(step=AVERAGED_STEP, path=path)

    def find_all(self, base_path: epath.PathLike) -> Iterator[ocp.path.step.Metadata]:
        try:
            return iter([self.find_step(base_path, AVERAGED_STEP)])
        except ValueError:
            return iter([])


def open_checkpoints(workdir: str | epath.Path) -> ocp.CheckpointManager:
    """A read-only manager over `<workdir>/checkpoints` (close it, or use it in `with`)."""
    return ocp.CheckpointManager(
        checkpoints_dir(workdir),
        item_names=CHECKPOINT_ITEMS,
        options=ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0),
    )


def open_averaged(workdir: str | epath.Path, *, write: bool = False) -> ocp.CheckpointManager:
    """A manager whose only step, AVERAGED_STEP, is `<workdir>/averaged` (read-only by default)."""
    return ocp.CheckpointManager(
        _root(workdir),
        item_names=AVERAGED_ITEMS,
        options=ocp.CheckpointManagerOptions(
            step_name_format=_AveragedName(),
            read_only=not write,
            create=write,
            save_interval_steps=0,
            enable_async_checkpointing=False,
        ),
    )


# ----------------------------------------------------------------------------- completeness


def _incomplete_reason(
    names: ocp.path.step.NameFormat, root: epath.Path, step: int, items: Sequence[str]
) -> str | None:
    """Why `step` under `root` is not a complete checkpoint, or None if it looks complete.

    Orbax lists only finished saves (renamed from their tmp directory locally, commit-marked
    on GCS), but a directory can still lose its commit record or items afterwards (a partial
    copy, a manual edit), so check. Orbax stamps the step's metadata with its commit time
    when the save finishes, before the rename or commit marker.
    """
    try:
        found = names.find_step(root, step)
    except ValueError:  # not there, or an unfinished (tmp) directory
        return "directory is missing"
    if not found.path.is_dir():
        return "directory is missing"
    try:
        committed = bool(found.commit_timestamp_nsecs)
    except (ValueError, TypeError, AttributeError):  # unreadable step metadata
        committed = False
    if not committed:
        return "no commit time in its step metadata: the save did not finish"
    missing = [name for name in items if not (found.path / name).is_dir()]
    if missing:
        return f"item(s) {missing} missing"
    return None


def step_incomplete_reason(
    directory: epath.Path, step: int, items: Sequence[str] = CHECKPOINT_ITEMS
) -> str | None:
    """Why checkpoint `step` in `directory` (a workdir's checkpoints/) is incomplete, or None."""
    return _incomplete_reason(_STEP_NAMES, directory, step, items)


def averaged_incomplete_reason(workdir: str | epath.Path, items: Sequence[str]) -> str | None:
    """Why `<workdir>/averaged` is incomplete, or None if it looks complete."""
    return _incomplete_reason(_AveragedName(), _root(workdir), AVERAGED_STEP, items)


def copy_step(src_workdir: str, dst_workdir: str, step: int) -> None:
    """Copies checkpoint `step` of one workdir into another's checkpoints/ (either may be in a
    bucket), each folder's commit records last: a copy cut off is an unfinished save, which
    `step_incomplete_reason` names and a resume skips."""
    src, dst = checkpoints_dir(src_workdir) / str(step), checkpoints_dir(dst_workdir) / str(step)
    storage.copy_tree(str(src), str(dst), last=COMMIT_RECORDS)


@contextlib.contextmanager
def quiet_orbax():
    """Orbax logs a damaged file at ERROR (via absl) before raising; the caller reports it once,
    naming the checkpoint, so those records are dropped while one is read."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        absl.setLevel(level)


def existing_steps(workdir: str | epath.Path) -> list[int]:
    """The steps Orbax lists under `<workdir>/checkpoints`, ascending, complete or not."""
    if not checkpoints_dir(workdir).is_dir():
        return []
    with quiet_orbax(), open_checkpoints(workdir) as mngr:  # damage is reported by the reader
        return sorted(mngr.all_steps())


def latest_step_on_disk(workdir: str | epath.Path) -> int | None:
    """The newest step Orbax lists in the workdir, complete or not (None if there is none)."""
    steps = existing_steps(workdir)
    return steps[-1] if steps else None


# ----------------------------------------------------------------------------- reading


def with_default_shardings(abstract: PyTree) -> PyTree:
    """Leaves without `.sharding` are restored onto the first local device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def fix(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or device)

    return jax.tree.map(fix, abstract)


def restore_params(mngr: ocp.CheckpointManager, step: int, abstract_params: PyTree) -> PyTree:
    """Reads only `state.params` of one checkpoint (the optimizer state stays on disk)."""
    abstract = {"params": with_default_shardings(abstract_params)}
    restored = mngr.restore(
        step,
        args=ocp.args.Composite(
            **{
                STATE: ocp.args.PyTreeRestore(
                    item=abstract,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                    partial_restore=True,
                )
            }
        ),
    )
    return restored[STATE]["params"]


def not_found(workdir: str | epath.Path, which: str, why: str) -> CheckpointNotFoundError:
    """The error for a missing checkpoint `which`, saying what the workdir does hold."""
    steps = existing_steps(workdir)
    exists = (
        f"checkpoints at steps {steps} exist under {checkpoints_dir(workdir)}"
        if steps
        else f"there are no checkpoints under {checkpoints_dir(workdir)}"
    )
    exists += (
        "; an averaged checkpoint exists"
        if averaged_dir(workdir).is_dir()
        else "; no averaged checkpoint"
    )
    return CheckpointNotFoundError(
        f"No checkpoint {which!r} in workdir {workdir}: {why}. {exists}. Pass which='latest', "
        "'averaged' or a step number; create an averaged checkpoint with "
        f"`python -m tfm_jax average --workdir={workdir} --last=5` (§6: 5 for base, 20 for big)."
    )
