"""Reading a run's checkpoints back: the params and config of "latest", a step or "averaged".

The workdir's layout is layout.py's. As `train` treats its own checkpoints, a checkpoint that
cannot be read (damaged files) is named with the reason: for "latest" the next older one is used,
with a warning; a step named by number, or a workdir where none reads, is a
CheckpointRestoreError. Orbax's own records of such a failure are dropped (debris.py): the error
says it once, naming the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from tfm_jax.checkpoint import debris
from tfm_jax.checkpoint.errors import CheckpointRestoreError
from tfm_jax.checkpoint.layout import (
    AVERAGED_STEP,
    CONFIG,
    PARAMS,
    averaged_dir,
    averaged_incomplete_reason,
    checkpoints_dir,
    existing_steps,
    not_found,
    open_averaged,
    open_checkpoints,
    quiet_orbax,
    restore_params,
    step_incomplete_reason,
    with_default_shardings,
)

log = logging.getLogger(__name__)

PyTree = Any


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
