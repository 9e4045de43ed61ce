"""Whether the next checkpoint fits on its filesystem, asked before a save starts.

A save that finds the disk full fails cleanly on one host (manager.Checkpointer._save_error),
but with several hosts the others wait for it at Orbax's commit barrier, for its 20-minute
timeout, while the failed host says nothing. So before each save process 0 compares the free
space with what the checkpoint will take, and every host stops on its answer, together. The
estimate is the newest checkpoint's size on disk (the same model; 7 checkpoints of one run
here differed by 1.2%), or before the first one, 80% of the train state's bytes (Orbax's files
of float32 Adam states measured 92% of them). Object storage has no free space to ask: skipped.
A save that fills the disk anyway (other writers, a larger checkpoint) fails as before.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from tfm_jax.platform import storage

FIRST_SAVE_FRACTION = 0.8  # of the train state's bytes: a lower bound on a first checkpoint


def _estimate(directory, newest: int | None, state) -> tuple[int, int]:
    """Bytes the next checkpoint needs, and on what basis: 1 the newest's size, 2 the state's."""
    if newest is not None:
        size = storage.bytes_on_disk(storage.join(directory, str(newest)))
        if size:
            return size, 1
    return int(FIRST_SAVE_FRACTION * state_bytes(state)), 2


def state_bytes(state) -> int:
    """The state's bytes as a checkpoint holds them: each array once, at its global shape
    (not its addressable shards, which count a replicated array once per local device)."""
    return sum(np.asarray(x).nbytes if np.isscalar(x) else x.nbytes for x in jax.tree.leaves(state))


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def shortfall(directory, step: int, newest: int | None, state) -> str | None:
    """Why checkpoint `step` will not fit in `directory`'s filesystem, or None (it fits, or
    the directory is on object storage). Every host must call it at the same save: process
    0 decides and the others take its answer."""
    if storage.is_remote(directory):
        return None
    numbers = np.zeros(3, np.float32)  # basis (0: it fits), bytes needed, bytes free
    if jax.process_index() == 0:
        need, basis = _estimate(directory, newest, state)
        free = storage.free_bytes(directory)
        if free is not None and free < need:
            numbers[:] = basis, need, free
    if jax.process_count() > 1:
        numbers = np.asarray(multihost_utils.broadcast_one_to_all(numbers))
    if not numbers[0]:
        return None
    need, free = numbers[1:]
    basis = (
        f"the size of checkpoint {newest}"
        if numbers[0] == 1
        else f"{FIRST_SAVE_FRACTION:.0%} of the train state's {_mb(state_bytes(state))}"
    )
    return (
        f"checkpoint {step} was not started: {_mb(free)} are free in {directory} and it needs "
        f"about {_mb(need)} ({basis}); training stopped. "
    )
