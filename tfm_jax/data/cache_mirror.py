"""The token cache on object storage: published to the bucket once, mirrored on each host.

`np.load(mmap_mode="r")` needs local files, and a bucket has no atomic folder rename. So with a
gs:// data.token_cache_dir (or a vocabulary, hence a workdir, in a bucket) the cache is built on
process 0 into a local folder, as on disk, then copied to the bucket with meta.json last: the
bucket's meta.json is the commit marker, and a cache whose meta.json is there and matches is
complete. Every host (process 0 on a later run too) copies a published cache into its local
scratch folder (`storage.scratch_dir()`, TFM_JAX_SCRATCH) and maps it from there; nothing is
tokenized twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket

from tfm_jax.platform import storage

log = logging.getLogger(__name__)

MARKER = "meta.json"


def local_path(root: str, name: str) -> str:
    """Where this host mirrors `<root>/<name>`: scratch, keyed by the remote root."""
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    return os.path.join(storage.scratch_dir(), "tokens", digest, name)


def published(remote: str, key: dict) -> bool:
    """Whether `remote` holds a complete cache for `key` (its meta.json is there and matches)."""
    marker = storage.join(remote, MARKER)
    try:
        return storage.exists(marker) and json.loads(storage.read_text(marker)).get("key") == key
    except (OSError, ValueError):
        return False


def publish(local: str, remote: str) -> None:
    """Copies a built cache to the bucket: any old marker first removed, the new one last."""
    marker = storage.path(storage.join(remote, MARKER))
    if marker.exists():
        marker.unlink()  # a stale cache being replaced is never read as the new one
    storage.copy_tree(local, remote, last=(MARKER,))
    log.info("token cache: published %s to %s", local, remote)


def fetch(remote: str, local: str) -> str:
    """Copies a published cache into a temporary folder beside `local`; returns that folder,
    for the caller to rename into place (token_cache._publish, which copes with a race)."""
    tmp = f"{local}.tmp-{socket.gethostname()}-{os.getpid()}"
    if os.path.isdir(tmp):
        storage.rmtree(tmp)
    os.makedirs(tmp)
    for child in storage.path(remote).iterdir():
        child.copy(storage.path(os.path.join(tmp, child.name)), overwrite=True)
    log.info("token cache: copied %s into %s", remote, local)
    return tmp
