"""What a failed Orbax read or write leaves behind, silenced once the failure has been reported.

When one array of a checkpoint fails to read (damaged files) or write (a full disk), Orbax raises
that error to its caller but leaves the coroutines it started for the other arrays to finish on
their own threads. Each then fails on its own, after the event loop that ran it is closed, and
Python prints it: "Task (or Future) exception was never retrieved", "Exception ignored in:
<coroutine ...>", "RuntimeError: Event loop is closed", and at exit "ImportError: sys.meta_path
is None". Dozens of tracebacks follow the one line that said what went wrong.

`after_failure()` is called by the code that caught and reported the failure (layout.py,
manager.py). From then on, in this process, exactly those leftovers are dropped; any other
error is still printed. Nothing is installed before a failure, so a healthy run prints all.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings

_MARK = "_tfm_jax_checkpoint_debris"


def _is_debris(exc: BaseException | None, where: object = None) -> bool:
    if exc is None:
        return False
    text = str(exc)
    if isinstance(exc, RuntimeError) and "Event loop is closed" in text:
        return True
    if isinstance(exc, ImportError) and "sys.meta_path is None" in text:
        return True
    code = getattr(where, "cr_code", None)  # a coroutine of Orbax's serialization
    return code is not None and "orbax" in code.co_filename


class _DropDebris(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "asyncio" and "exception was never retrieved" in message:
            return False  # Orbax's tasks and futures for the other arrays
        if record.name == "absl" and record.levelno >= logging.ERROR:  # Orbax's own threads
            return "raised an exception" not in message
        return True


def _wrap(hook, drop):
    def wrapped(*args):
        if not drop(*args):
            hook(*args)

    setattr(wrapped, _MARK, True)
    return wrapped


def after_failure() -> None:
    """Drops, from now on, the leftovers of a failed Orbax read or write (idempotent)."""
    if getattr(sys.unraisablehook, _MARK, False):
        return
    sys.unraisablehook = _wrap(sys.unraisablehook, lambda u: _is_debris(u.exc_value, u.object))
    sys.excepthook = _wrap(sys.excepthook, lambda _t, exc, _tb: _is_debris(exc))
    threading.excepthook = _wrap(threading.excepthook, lambda a: _is_debris(a.exc_value))
    for name in ("asyncio", "absl"):
        logging.getLogger(name).addFilter(_DropDebris())
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited")
