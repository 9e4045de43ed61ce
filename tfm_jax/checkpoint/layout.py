"""Where a run's checkpoints live in its workdir, which are complete, and reading params and config.

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from tfm_jax.checkpoint import debris
from tfm_jax.checkpoint.errors import CheckpointNotFoundError, CheckpointRestoreError
from tfm_jax.config import paths

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


def read_error_reason(e: BaseException) -> str:
    """An Orbax/TensorStore error as one short line: the innermost cause (what failed on disk),
    without TensorStore's many-line spec."""
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    text = " ".join(str(e).split("See full TensorStore details")[0].split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _parse_which(workdir: str | epath.Path, which: str, steps: list[int]) -> int | None:
    """None for 'latest', else the step number `which` names (an error if it was not saved)."""
    if which == "latest":
        return None
    try:
        step = int(which)
    except ValueError:
        raise ValueError(
            f"which must be 'averaged', 'latest' or a step number, got {which!r}"
        ) from None
    if step not in steps:
        raise not_found(workdir, which, f"step {step} was not saved (or was deleted)")
    return step


def _read_checkpoint(
    workdir: str | epath.Path,
    which: str,
    what: str,
    read: Callable[[Any, int], Any],
    warn: bool = True,
) -> tuple[Any, int]:
    """`read(manager, step)` of `which` checkpoint ('latest' or a step), and the step read.

    As `train` treats its checkpoints: for 'latest', a checkpoint that is incomplete or fails to
    read (damaged files) is named with the reason and the next older one is tried, with a
    warning saying which step was used instead; CheckpointRestoreError if none reads. A step
    named by number that fails to read is a CheckpointRestoreError naming it and why.
    warn=False logs the fallback at INFO (a caller that warns when it reads the params).
    """
    directory = checkpoints_dir(workdir)
    steps = existing_steps(workdir)
    named = _parse_which(workdir, which, steps)
    failed: list[tuple[int, str]] = []
    with quiet_orbax(), open_checkpoints(workdir) as mngr:
        for step in [named] if named is not None else reversed(steps):
            reason = step_incomplete_reason(directory, step)
            if reason is None:
                try:
                    value = read(mngr, step)
                except Exception as e:  # Orbax/TensorStore/JSON raise many kinds
                    debris.install()  # reported here, with the step; not again
                    reason = f"cannot be read ({read_error_reason(e)})"
            if reason is None:
                if failed:
                    (log.warning if warn else log.info)(
                        "Using checkpoint %d for the %s: the newer %s",
                        step,
                        what,
                        "; ".join(f"checkpoint {s} {r}" for s, r in failed),
                    )
                return value, step
            if named is not None:
                raise CheckpointRestoreError(
                    f"checkpoint {step} in {directory}: {reason}. Pass --checkpoint=latest to "
                    "use the newest checkpoint that reads, or another step of "
                    f"{[s for s in steps if s != step]}"
                )
            failed.append((step, reason))
    if not failed:
        raise not_found(workdir, which, "no complete checkpoint was saved")
    details = "; ".join(f"step {s}: {r}" for s, r in failed)
    raise CheckpointRestoreError(
        f"no checkpoint in {directory} can be read for the {what} ({details}). The files are "
        f"damaged or incomplete: restore them from a copy, or move them aside (`mv {directory} "
        f"{directory}.damaged`) and train again"
    )


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


def _read_averaged(workdir: str | epath.Path, what: str, read: Callable[[Any], Any]) -> Any:
    """`read(manager)` of `<workdir>/averaged`; CheckpointRestoreError naming it if it fails."""
    try:
        with quiet_orbax(), open_averaged(workdir) as mngr:
            return read(mngr)
    except Exception as e:  # Orbax/TensorStore/JSON raise many kinds
        debris.install()
        raise CheckpointRestoreError(
            f"the averaged checkpoint {averaged_dir(workdir)} cannot be read for the {what} "
            f"({read_error_reason(e)}). Average again (`python -m tfm_jax average "
            f"--workdir={workdir}`), or pass --checkpoint=latest or a step"
        ) from None


def _check_averaged(workdir: str | epath.Path, item: str) -> None:
    if averaged_incomplete_reason(workdir, (item,)) is not None:
        path = averaged_dir(workdir)
        raise not_found(workdir, "averaged", f"{path} does not exist or is incomplete")


def load_params(workdir: str | epath.Path, which: str, abstract_params: PyTree) -> PyTree:
    """Params of `which` checkpoint: 'averaged', 'latest' or a step number (as a string).

    Restored into `abstract_params`' shardings. 'latest' skips incomplete or unreadable
    checkpoints with a warning naming each; CheckpointRestoreError if none reads, or if the step
    named cannot be read. Raises CheckpointNotFoundError saying what exists if `which` does not.
    """
    which = str(which)
    if which == "averaged":
        _check_averaged(workdir, PARAMS)
        abstract = with_default_shardings(abstract_params)
        args = ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(abstract)})
        return _read_averaged(
            workdir, "params", lambda mngr: mngr.restore(AVERAGED_STEP, args=args)
        )[PARAMS]
    params, step = _read_checkpoint(
        workdir, which, "params", lambda mngr, step: restore_params(mngr, step, abstract_params)
    )
    log.info("Loaded the params of step %d from %s", step, workdir)
    return params


def read_config_json(
    workdir: str | epath.Path, which: str = "latest", *, warn: bool = True
) -> dict[str, Any]:
    """The run's config (as a dict) stored with `which` checkpoint (see `load_params`).

    Rebuild it with `ml_collections.ConfigDict(read_config_json(workdir))`. warn=False: a
    fallback to an older checkpoint's config is logged at INFO (for a caller that then loads the
    params and warns about the same damage once).
    """
    which = str(which)
    args = ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()})
    if which == "averaged":
        _check_averaged(workdir, CONFIG)
        return dict(
            _read_averaged(workdir, "config", lambda mngr: mngr.restore(AVERAGED_STEP, args=args))[
                CONFIG
            ]
        )
    config, _ = _read_checkpoint(
        workdir,
        which,
        "config",
        lambda mngr, step: dict(mngr.restore(step, args=args)[CONFIG]),
        warn=warn,
    )
    return config
