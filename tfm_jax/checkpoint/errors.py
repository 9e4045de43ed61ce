"""The errors the checkpoint package raises, importable without loading Orbax or JAX."""


class NonFiniteStateError(ValueError):
    """Raised instead of saving a state whose params contain NaN or Inf."""


class CheckpointNotFoundError(FileNotFoundError):
    """The requested checkpoint does not exist in the workdir."""


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the directory could be restored."""


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (a full disk, an I/O error); training stopped. The
    message names the path, the newest complete checkpoint and how to resume."""
