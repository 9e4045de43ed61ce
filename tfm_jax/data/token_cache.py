"""Token cache: a split tokenized once, in worker processes, into .npy files later runs memory-map.

Layout: `<root>/<split>-<digest>/` holds the `TokenizedSplit` arrays as src_ids.npy,
src_offsets.npy, tgt_ids.npy, tgt_offsets.npy, pair_index.npy, and meta.json (the key and the
counts). `<root>` is data.token_cache_dir, else `tokens/` beside the vocabulary model (by default
`<workdir>/vocab/tokens/`); data.token_cache_dir="" turns the cache off. The digest covers what
selects a variant (where the split comes from, its direction, the vocabulary's content hash,
max_len, overlong, the format), so runs that differ there keep their own caches side by side;
meta.json adds the source's state (the folder files' sizes and mtimes, or the tfds prepared
version), and a cache whose meta differs (the corpus changed) is rebuilt in place, never used.

Why flat numpy + offsets rather than array_record: `np.load(mmap_mode="r")` maps the files without
reading them, so a start, resume or extra host costs milliseconds and one host's processes share
the page cache; pair i is two slices located by its offsets, O(1) for any pair order a plan asks
for; the whole-split views planning needs (lengths = np.diff(offsets)) are one vectorized pass;
and numpy is already a dependency, where array_record would add one and decode a record per pair.
The maps keep the kernel's default readahead: madvise(MADV_RANDOM) lowered the warm start's RSS
at 4.5M pairs from 1.58 to 1.20 GB (page cache, which RSS counts), but with the files not yet in
the page cache it cut the batches/s from 291 to 22, one 4 KiB disk read per pair
(experiments/results/input_scale.md).

Writes are atomic: a build goes into `<name>.tmp-<host>-<pid>/` beside its final place, is
fsynced, then renamed; readers only open a directory whose meta.json matches, so a killed build
leaves a temp directory that is ignored (and removed by the next build once its process is gone).
Only process 0 builds; other processes poll for a matching meta.json (and for an error of
another process, left in the job's key-value store: platform/notices.py), so all hosts must
see the same folder: a shared filesystem, or a bucket (a gs:// root is built locally and
published there, and each host maps its own local copy: cache_mirror.py). Workers start by
forkserver, not fork (the trainer holds JAX's threads), so they import the main script: guard
a script's entry point with `if __name__ == "__main__":`. Evaluation splits are small and
stay in memory (batching.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time

import ml_collections
import numpy as np

from tfm_jax.config import paths
from tfm_jax.data import cache_mirror
from tfm_jax.data.sources import DataError, source_identity
from tfm_jax.data.tokenized import (
    TokenizedSplit,
    encode_split,
    offsets_of,
    report_overlong,
    summarize_chunks,
    tokenize_split,
    tokens_kept,
)
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.platform import notices, storage

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the files' layout or meaning changes
ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets", "pair_index")
_DTYPES = {"src_ids": np.int32, "tgt_ids": np.int32}  # the rest are int64
WAIT_TIMEOUT_S = 1800.0  # how long process k > 0 waits for process 0's build
_STALE_S = 24 * 3600  # another host's temp dir is left alone this long


def cache_root(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> str | None:
    """data.token_cache_dir, else `tokens/` beside the vocabulary's file; None: cache off."""
    if cfg.get("token_cache_dir") == "":
        return None
    if cfg.get("token_cache_dir"):
        return paths.resolve(cfg.token_cache_dir)
    if tokenizer.path:
        return storage.join(storage.dirname(tokenizer.path), "tokens")
    return None


def cache_key(
    cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, split: str, overlong: str
) -> dict:
    """What the cached arrays depend on; `source_state` says whether the source has changed."""
    where, state = source_identity(cfg, split)
    return {
        "format": FORMAT,
        "source": where,
        "vocab_sha256": tokenizer.content_hash,
        "max_len": int(cfg.max_len),
        "overlong": overlong,
        "source_state": state,
    }


def cache_dir_name(key: dict) -> str:
    variant = {k: v for k, v in key.items() if k != "source_state"}
    digest = hashlib.sha256(json.dumps(variant, sort_keys=True).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', key['source']['split'])}-{digest}"


# ----------------------------------------------------------------------------- reading


def _differs(saved: dict, key: dict) -> str:
    fields = sorted(k for k in set(saved) | set(key) if saved.get(k) != key.get(k))
    if fields == ["source_state"]:
        return f"the source changed: {saved.get('source_state')} -> {key['source_state']}"
    return f"meta.json differs in {', '.join(fields)}"


def read_cache(path: str, key: dict) -> tuple[TokenizedSplit | None, dict | None, str]:
    """(split as memmaps, meta, "") if `path` holds a complete cache for `key`, else
    (None, None, why not)."""
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        exists = os.path.isdir(path)
        return None, None, "no meta.json (an incomplete cache)" if exists else "not built yet"
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("key") != key:
            return None, None, _differs(meta.get("key") or {}, key)
        arrays = {a: np.load(os.path.join(path, f"{a}.npy"), mmap_mode="r") for a in ARRAYS}
        n = meta["num_pairs"]
        ok = all(
            arrays[a].dtype == _DTYPES.get(a, np.int64) and arrays[a].ndim == 1 for a in ARRAYS
        )
        ok = ok and len(arrays["pair_index"]) == n
        for side in ("src", "tgt"):
            offsets, ids = arrays[f"{side}_offsets"], arrays[f"{side}_ids"]
            ok = ok and len(offsets) == n + 1 and len(ids) == meta[f"{side}_tokens"]
            ok = ok and int(offsets[0]) == 0 and int(offsets[-1]) == len(ids)
    except (OSError, ValueError, KeyError, TypeError) as e:  # bad JSON, a damaged .npy, ...
        return None, None, f"unreadable: {e!r}"
    if not ok:
        return None, None, "the arrays do not match meta.json's counts (a damaged cache)"
    return TokenizedSplit(**arrays), meta, ""


# ----------------------------------------------------------------------------- writing


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)  # a directory too: makes its renames durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save(path: str, parts: list[np.ndarray], dtype) -> int:
    """Writes the parts end to end as one .npy file (fsynced); returns its length."""
    total = sum(len(p) for p in parts)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(total,))
    pos = 0
    for p in parts:
        out[pos : pos + len(p)] = p
        pos += len(p)
    out.flush()
    del out
    _fsync(path)
    return total


def _temp_owner_gone(name: str, age_s: float) -> bool:
    """Whether the build that owns a `.tmp-<host>-<pid>` / `.old-<host>-<pid>` dir has ended."""
    host, _, pid = name.rpartition("-")
    host = host.split(".tmp-", 1)[-1].split(".old-", 1)[-1]
    if age_s > _STALE_S:
        return True  # no build takes this long
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's build may still be running
    if int(pid) == os.getpid():
        return True  # an earlier build of this process, interrupted
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # alive (another user's)
    return False


def _remove_leftovers(root: str, name: str) -> None:
    for entry in os.listdir(root):
        if entry.startswith((f"{name}.tmp-", f"{name}.old-")):
            path = os.path.join(root, entry)
            try:
                age = time.time() - os.stat(path).st_mtime
            except OSError:
                continue
            if _temp_owner_gone(entry, age):
                log.info("token cache: removing %s, left by an interrupted build", path)
                shutil.rmtree(path, ignore_errors=True)


def _publish(tmp: str, final: str, key: dict, suffix: str) -> None:
    """Renames the built `tmp` to `final`, moving a stale `final` aside first."""
    for _ in range(3):
        try:
            os.rename(tmp, final)
            _fsync(os.path.dirname(final))
            return
        except OSError:
            if not os.path.isdir(final):
                raise
        if read_cache(final, key)[0] is not None:  # another build finished first: same arrays
            shutil.rmtree(tmp, ignore_errors=True)
            return
        old = f"{final}.old-{suffix}"
        try:
            os.rename(final, old)  # readers that mapped its files keep them until they unmap
        except FileNotFoundError:
            continue
        shutil.rmtree(old, ignore_errors=True)
    raise DataError(f"{final}: could not replace the stale token cache; delete it and retry.")


def build_cache(
    cfg: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    split: str,
    overlong: str,
    final: str,
    key: dict,
    num_workers: int,
) -> dict:
    """Tokenizes the split into a temp directory beside `final`, then renames it into place.

    Returns the key written (a tfds source prepared during the build has a new state)."""
    root, name = os.path.split(final)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise DataError(
            f"cannot create the token cache folder {root} ({e}); set data.token_cache_dir to a "
            'writable folder, or data.token_cache_dir="" to tokenize in memory at every start.'
        ) from None
    _remove_leftovers(root, name)
    suffix = f"{socket.gethostname()}-{os.getpid()}"
    tmp = f"{final}.tmp-{suffix}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    start = time.perf_counter()
    try:
        chunks = encode_split(cfg, tokenizer, split, overlong, num_workers)
        index, n_over, n_seen = summarize_chunks(split, cfg, overlong, chunks)
        if cfg.source == "tfds":  # prepared just now if it was not before
            key = dict(key, source_state=source_identity(cfg, split)[1])
        counts = {"num_pairs": len(index), "num_seen": n_seen, "num_overlong": n_over}
        for side in ("src", "tgt"):
            ids = [getattr(c, f"{side}_ids") for c in chunks]
            counts[f"{side}_tokens"] = _save(os.path.join(tmp, f"{side}_ids.npy"), ids, np.int32)
            lens = [getattr(c, f"{side}_lens") for c in chunks]
            _save(os.path.join(tmp, f"{side}_offsets.npy"), [offsets_of(lens)], np.int64)
        del chunks
        _save(os.path.join(tmp, "pair_index.npy"), [index], np.int64)
        seconds = time.perf_counter() - start
        meta = {"key": key, **counts, "build_seconds": round(seconds, 2)}
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        _publish(tmp, final, key, suffix)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("token cache: %r tokenized in %.2f s into %s", split, seconds, final)
    return key


# ----------------------------------------------------------------------------- entry point


def cached_tokenize_split(
    cfg: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    split: str,
    overlong: str,
    *,
    process_index: int = 0,
    num_workers: int | None = None,
    wait_timeout_s: float = WAIT_TIMEOUT_S,
    poll_s: float = 1.0,
) -> TokenizedSplit:
    """`tokenize_split`'s result as memory-mapped arrays from the token cache, built if needed.

    Process 0 builds a missing or stale cache with `num_workers` processes (default
    data.num_workers, at most one per CPU); any other process waits for it. With the cache off
    (data.token_cache_dir="", or a vocabulary that has no file and no folder set) this is
    `tokenize_split`.
    """
    tokens_kept(cfg, overlong)  # the same errors, cache or not
    root = cache_root(cfg, tokenizer)
    if root is None:
        why = "no vocabulary file" if cfg.get("token_cache_dir") is None else '""'
        log.info("token cache off (data.token_cache_dir: %s): tokenizing %r in memory", why, split)
        return tokenize_split(cfg, tokenizer, split, overlong)
    key = cache_key(cfg, tokenizer, split, overlong)
    name = cache_dir_name(key)
    final = storage.join(root, name)
    # on object storage: built or read in a local mirror, published to the bucket (cache_mirror)
    remote = storage.is_remote(root)
    local = cache_mirror.local_path(root, name) if remote else final
    if process_index == 0:
        return _build_or_read(cfg, tokenizer, split, overlong, key, (final, local), num_workers)
    start = noted = time.monotonic()
    while (got := read_cache(local, key))[0] is None:
        if (failed := notices.heard(notices.FAILED)) is not None:  # the CLI leaves its error
            raise notices.AnotherProcessFailed(
                f"process {process_index} stopped waiting for the token cache {final}: {failed}"
            )
        if remote and cache_mirror.published(final, key):
            with _cache_io(f"copy the token cache {final} into {local}"):
                got = _fetch(final, local, key)
            if got[0] is not None:
                break
        waited = time.monotonic() - start
        if waited > wait_timeout_s:
            raise DataError(
                f"process {process_index} waited {wait_timeout_s:.0f} s for process 0 to write "
                f"the token cache {final} (last: {got[2]}). All processes must see the same "
                "data.token_cache_dir (a shared filesystem or a bucket) and process 0 must be "
                'running; or set data.token_cache_dir="" to tokenize on every host.'
            )
        if time.monotonic() - noted > 60:
            noted = time.monotonic()
            log.info("process %d: waiting %.0f s (of %.0f) for process 0's token cache %s (%s)",
                     process_index, waited, wait_timeout_s, final, got[2])  # fmt: skip
        time.sleep(poll_s)
    log.info("token cache: %d pairs of %r mapped from %s (process 0's)", len(got[0]), split, local)
    return got[0]


def _build_or_read(cfg, tokenizer, split, overlong, key, where, num_workers) -> TokenizedSplit:
    """Process 0's part: the cache read, fetched from the bucket, or built (and published)."""
    final, local = where
    remote = final != local
    got, meta, why = read_cache(local, key)
    if got is None and remote and cache_mirror.published(final, key):
        with _cache_io(f"copy the token cache {final} into {local}"):
            got, meta, why = _fetch(final, local, key)
    if got is None:
        log.info("token cache %s: building (%s)", final, why)
        workers = num_workers or cfg.num_workers
        with _cache_io(f"write the token cache {local}"):
            key = build_cache(cfg, tokenizer, split, overlong, local, key, workers)
        got, meta, why = read_cache(local, key)
        if got is None:
            raise DataError(f"{local}: unreadable right after it was built ({why}).")
    else:
        n_over, n_seen = meta.get("num_overlong", 0), meta.get("num_seen", len(got))
        report_overlong(split, cfg, overlong, n_over, n_seen, len(got))
    if remote and not cache_mirror.published(final, key):
        with _cache_io(f"publish the token cache {local} to {final}"):
            cache_mirror.publish(local, final)  # the other hosts wait for this
    log.info("token cache: %d pairs of %r mapped from %s", len(got), split, local)
    return got


@contextlib.contextmanager
def _cache_io(doing: str):
    """An OSError while `doing` (a full disk, a file-size limit, no permission, a bucket that
    cannot be reached: not the data) as one DataError line that says what and where."""
    try:
        yield
    except OSError as e:
        raise DataError(
            f"could not {doing} ({e.strerror or e}). Make room there, or set "
            'data.token_cache_dir to another folder ("": no cache, each host tokenizes in memory)'
        ) from e


def _fetch(remote: str, local: str, key: dict) -> tuple[TokenizedSplit | None, dict | None, str]:
    """A published cache copied from the bucket into this host's mirror, then read."""
    tmp = cache_mirror.fetch(remote, local)
    _publish(tmp, local, key, f"{socket.gethostname()}-{os.getpid()}")
    return read_cache(local, key)
