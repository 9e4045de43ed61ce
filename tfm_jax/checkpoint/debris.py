"""What a failed Orbax read or write leaves behind, dropped: its failure is reported once.

When one array of a checkpoint fails to read (damaged files) or write (a full disk), Orbax raises
that error to its caller but leaves the coroutines it started for the other arrays to finish on
their own threads. Each then fails on its own, after the event loop that ran it is closed, and
Python prints it: "Task (or Future) exception was never retrieved", "Exception ignored in:
<coroutine ...>", "RuntimeError: Event loop is closed", and at exit "ImportError: sys.meta_path
is None". Dozens of tracebacks follow the one line that said what went wrong.

`install()` drops exactly those records, in this process, from then on: records that come from
Orbax's own coroutines, threads and asyncio loops (by their traceback or source file), never an
error raised by other code. The failure itself is never among them: it reaches the caller that
read or saved (layout.py, manager.py), which reports it as one error naming the checkpoint. A
read installs it once its failure is caught; a save installs it when the save starts, because an
async save's threads print their tracebacks while training goes on, before the failure reaches
`Checkpointer.wait`.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings

_MARK = "_tfm_jax_checkpoint_debris"


def _only_asyncio_or_orbax(tb) -> bool:
    """Whether every frame of a traceback is asyncio's or Orbax's: a callback that TensorStore's
    threads ran on a closed loop, not an error raised by our code or the user's."""
    frames = 0
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "asyncio" not in name and "orbax" not in name:
            return False
        frames, tb = frames + 1, tb.tb_next
    return frames > 0


def _is_debris(exc: BaseException | None, where: object = None) -> bool:
    if exc is None:
        return False
    code = getattr(where, "cr_code", None)  # a coroutine of Orbax's serialization
    if code is not None and "orbax" in code.co_filename:
        return True
    if isinstance(exc, ImportError) and "sys.meta_path is None" in str(exc):
        return True  # an Orbax thread still running while the interpreter shuts down
    return (
        isinstance(exc, RuntimeError)
        and "Event loop is closed" in str(exc)
        and _only_asyncio_or_orbax(exc.__traceback__)
    )


class _DropDebris(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "asyncio" and "exception was never retrieved" in message:
            return "orbax" not in message  # Orbax's tasks and futures for the other arrays
        if record.name == "absl" and record.levelno >= logging.ERROR and "orbax" in record.pathname:
            # Orbax logging, with its traceback, the error it then raises to the caller
            return not (record.exc_info or "raised an exception" in message)
        return True


def _wrap(hook, drop):
    def wrapped(*args):
        if not drop(*args):
            hook(*args)

    setattr(wrapped, _MARK, True)
    return wrapped


def install() -> None:
    """Drops, from now on, the leftovers of a failed Orbax read or write (idempotent)."""
    if getattr(sys.unraisablehook, _MARK, False):
        return
    sys.unraisablehook = _wrap(sys.unraisablehook, lambda u: _is_debris(u.exc_value, u.object))
    sys.excepthook = _wrap(sys.excepthook, lambda _t, exc, _tb: _is_debris(exc))
    threading.excepthook = _wrap(threading.excepthook, lambda a: _is_debris(a.exc_value))
    for name in ("asyncio", "absl"):
        logging.getLogger(name).addFilter(_DropDebris())
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited")
