"""The command line's logging: tfm_jax's messages at INFO on stderr, libraries at WARNING.

Every tfm_jax module logs with the standard library (`log = logging.getLogger(__name__)`); only
the CLI (cli/main.py's main, cli/inference.py's main) configures anything, here.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (not the one at setup), so a
    caller that swaps sys.stderr (pytest's capsys, a redirect) still gets the messages."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _not_orbax_read_only(record: logging.LogRecord) -> bool:
    # Orbax warns each time a checkpoint folder is opened for reading (as `average` does).
    return "read only" not in record.getMessage()


class _PrimaryOnly(logging.Filter):
    """Drops records below ERROR: on every process but 0, so a run has one log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def only_errors_unless_primary(process_index: int) -> None:
    """On processes other than 0 of a multi-host run, keep only errors (and Python warnings,
    routed through logging, are dropped with the rest): progress, warnings and notices come
    from process 0, while each process's own errors still reach its own stderr."""
    if process_index == 0:
        return
    logging.captureWarnings(True)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler) and not any(
            isinstance(f, _PrimaryOnly) for f in handler.filters
        ):
            handler.addFilter(_PrimaryOnly())


def setup_logging() -> None:
    """One handler, on the root logger, so records still propagate (pytest's caplog sees them)
    and each is written once; tfm_jax at INFO, everything else at the root's WARNING. Also
    keeps absl's logging (Orbax's) from installing its own root handler (logging.basicConfig)
    when it first logs. Idempotent."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        # logging.basicConfig's plain handler: absl installs one when a library (Orbax, at
        # import) logs before this ran, and every record would then be written twice. Test
        # harnesses' handlers (pytest's are subclasses) stay.
        if type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    logger = logging.getLogger("tfm_jax")
    logger.setLevel(logging.INFO)
    logger.propagate = True
    absl = logging.getLogger("absl")
    if _not_orbax_read_only not in absl.filters:
        absl.addFilter(_not_orbax_read_only)
