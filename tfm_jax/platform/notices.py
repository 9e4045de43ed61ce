"""Notes one process of a multi-host job leaves for the others, in the job's coordination
service (the key-value store `jax.distributed.initialize` starts on process 0's coordinator).

Processes that wait for one another on a shared filesystem (the token cache: process 0 builds
it, the others poll for its files) cannot tell "still working" from "failed": a process 0 that
failed left the others polling until their timeout (30 minutes), while it sat in JAX's shutdown
barrier for 5 and was aborted. A failure noted here reaches them at their next poll (and the
save barriers of checkpoint/agreement.py give up on one). The store lives as long as the job,
so a note cannot be stale from an earlier run; without `jax.distributed` (one process) there
is no one to tell, and nothing is kept.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

PREFIX = "tfm_jax/"


def client():
    """The job's coordination-service client, or None without `jax.distributed`."""
    from jax._src import distributed  # where jax.experimental.multihost_utils finds it too

    return distributed.global_state.client


def tell(key: str, value: str) -> bool:
    """Leaves `value` under `key` for the job's other processes; whether there was a job to
    tell. Best effort: it is said on the way out of a failure, which must stay that failure."""
    store = client()
    if store is None:
        return False
    try:
        store.key_value_set(PREFIX + key, value)
    except Exception as e:  # noqa: BLE001 - a second note of the same key, a lost coordinator
        log.info("could not leave the note %r for the other processes: %s", key, e)
        return False
    return True


def heard(key: str) -> str | None:
    """The value another process left under `key`, or None (not yet, or no job)."""
    store = client()
    if store is None:
        return None
    try:
        return store.key_value_try_get(PREFIX + key)
    except Exception:  # noqa: BLE001 - NOT_FOUND: nothing left there (yet)
        return None
