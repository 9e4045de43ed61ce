"""The errors a user can cause, reported as one line on stderr instead of a traceback."""

from __future__ import annotations

import sys

from tfm_jax.config.validate import ConfigError


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors a user can cause besides config errors (bad data or input, missing checkpoint, NaN
    loss). The modules are imported only when an error is being reported."""
    from tfm_jax import data
    from tfm_jax.checkpoint import errors as ckpt_errors
    from tfm_jax.decode.load import InferenceError
    from tfm_jax.platform.lease import LeaseHeldError
    from tfm_jax.platform.notices import AnotherProcessFailed
    from tfm_jax.platform.storage import StorageError
    from tfm_jax.train import loop

    return (
        InferenceError,
        data.DataError,
        ckpt_errors.CheckpointNotFoundError,
        ckpt_errors.CheckpointRestoreError,
        ckpt_errors.CheckpointSaveError,  # a full disk or an I/O error while saving
        ckpt_errors.NonFiniteStateError,
        loop.NonFiniteLossError,
        LeaseHeldError,  # another `train` holds the workdir
        AnotherProcessFailed,  # this host stopped for another's error, which the message says
        StorageError,  # a gs:// path without the gcs extra
        FileNotFoundError,
    )


def report(e: BaseException) -> int | None:
    """Prints a user error as one line on stderr and returns its exit code (config errors 2,
    a closed stdout 141, others 1); None for an error that is a bug (the caller re-raises it)."""
    from tfm_jax.platform import host, storage

    if isinstance(e, BrokenPipeError) and host.reader_gone():
        # stdout's reader went away (`params ... | head`): the output is lost, and what the
        # command did is done. Quiet, where Python prints a traceback here and another at exit;
        # the exit code is that of a writer stopped by SIGPIPE, as a shell reads it. Another
        # pipe broken (stdout still read) is no user error: it is re-raised, with its trace
        host.silence_stdout()
        return 128 + 13
    if isinstance(e, ConfigError):
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if storage.is_disk_full(e):
        where = f" writing {e.filename}" if e.filename else ""
        print(
            f"error: no space left on the device{where} ({e.strerror}). Free space (or move the "
            "workdir), then run the same command: training resumes from its newest checkpoint",
            file=sys.stderr,
        )
        return 1
    if isinstance(e, user_errors()):
        print(f"error: {e}", file=sys.stderr)
        return 1
    return None


def tell_the_other_processes(e: BaseException) -> None:
    """In a multi-host job, leaves this process's error for the processes that wait for it (the
    token cache, the rendezvous before training, a save's barriers), which then stop at once
    with it (platform/notices.py); nothing with one process."""
    from tfm_jax.platform import notices

    if notices.client() is None or isinstance(e, notices.AnotherProcessFailed):
        return  # no job, or said first by the process that failed
    if isinstance(e, ConfigError):
        why = f"config error: {e}"
    elif isinstance(e, (OSError, *user_errors())):
        why = str(e)
    else:
        why = f"{type(e).__name__}: {e}"
    notices.tell_failed(why)
