"""The one way tfm_jax touches a run's files: local folders and object storage (`gs://`) alike.

Everything under a workdir, a data dir, a vocabulary path or a token-cache dir is read and written
through `path()` (etils' epath, which Orbax already uses for the checkpoints), or through Orbax
and tensorboardX, which take the same URLs. `tests/unit/test_layout.py` fails on any other way of
opening files in tfm_jax/ (plain `open`, `os.makedirs`, ...) outside the few places that need a
local file by nature (the token cache's memory maps, /proc, config files executed as Python).

Object stores differ from a filesystem in ways the callers here rely on being handled:
- no append: `append_lines` rewrites the object (metrics.jsonl is small);
- no atomic rename of a folder: a folder is published by writing its marker file last
  (the token cache's meta.json, Orbax's commit_success.txt);
- no folders: `makedirs` is a no-op there;
- `np.load(mmap_mode="r")` needs a local file: `download_dir` copies a folder into local scratch;
- no copy between stores: `copy_tree` streams each file through epath (`copy_file`), either end
  local or remote.

A `gs://` path needs gcsfs (epath reaches GCS through fsspec): without it, `path()` raises a
`StorageError` naming the extra, `pip install -e '.[gcs]'`.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import posixpath
import shutil
import tempfile

from etils import epath

REMOTE_SCHEMES = ("gs://", "s3://")


class StorageError(OSError):
    """A path that cannot be reached (a missing client library); the message says what to do."""


def is_remote(p: str | os.PathLike) -> bool:
    return os.fspath(p).startswith(REMOTE_SCHEMES)


def _require_client(p: str) -> None:
    if p.startswith("gs://") and importlib.util.find_spec("gcsfs") is None:
        raise StorageError(
            f"{p}: gs:// paths need gcsfs and google-cloud-storage, which are not installed: "
            "pip install -c constraints.txt -e '.[gcs]'"
        )


def path(p: str | os.PathLike) -> epath.Path:
    """An epath.Path for a local path or a gs:// URL."""
    text = os.fspath(p)
    if is_remote(text):
        _require_client(text)
    return epath.Path(text)


def join(base: str | os.PathLike, *parts: str) -> str:
    """`os.path.join` that keeps a URL a URL (never "gs:/bucket" nor a local abspath)."""
    base = os.fspath(base)
    return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def dirname(p: str | os.PathLike) -> str:
    text = os.fspath(p)
    return posixpath.dirname(text) if is_remote(text) else os.path.dirname(os.path.abspath(text))


def makedirs(p: str | os.PathLike) -> None:
    """The folder and its parents; nothing on object storage, which has no folders."""
    if not is_remote(p):
        path(p).mkdir(parents=True, exist_ok=True)


def exists(p: str | os.PathLike) -> bool:
    return path(p).exists()


def isfile(p: str | os.PathLike) -> bool:
    return path(p).is_file()


def isdir(p: str | os.PathLike) -> bool:
    return path(p).is_dir()


def file_state(p: str | os.PathLike) -> tuple[int, int]:
    """(size in bytes, modification time) of a file, (-1, -1) if it is missing: what a cache
    keyed on a file compares. Locally st_mtime_ns; on object storage the object's time."""
    try:
        if not is_remote(p):
            st = os.stat(os.fspath(p))
            return st.st_size, st.st_mtime_ns
        st = path(p).stat()
        return int(st.length), int(st.mtime)
    except (OSError, FileNotFoundError):
        return -1, -1


def listdir(p: str | os.PathLike) -> list[str]:
    return sorted(c.name for c in path(p).iterdir())


def read_text(p: str | os.PathLike) -> str:
    return path(p).read_text(encoding="utf-8")


def read_bytes(p: str | os.PathLike) -> bytes:
    return path(p).read_bytes()


def write_bytes(p: str | os.PathLike, data: bytes) -> None:
    """Writes the whole file so that no reader ever sees half of it: locally into a temporary
    file renamed over it; on object storage one upload (an object appears whole or not at all)."""
    target = path(p)
    if is_remote(p):
        target.write_bytes(data)
        return
    makedirs(os.path.dirname(os.path.abspath(os.fspath(p))))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=os.fspath(target.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.fspath(target))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(p: str | os.PathLike, text: str) -> None:
    write_bytes(p, text.encode("utf-8"))


def append_lines(p: str | os.PathLike, lines: list[str]) -> None:
    """Appends lines (each without its newline): a local append; on object storage, which
    cannot append, the object rewritten with them at its end."""
    if not lines:
        return
    text = "".join(line + "\n" for line in lines)
    if not is_remote(p):
        makedirs(os.path.dirname(os.path.abspath(os.fspath(p))))
        try:
            with path(p).open("a", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:  # a failed write or flush names no file: say which
            e.filename = e.filename or os.fspath(p)
            raise
        return
    old = read_text(p) if exists(p) else ""
    write_text(p, old + text)


def rmtree(p: str | os.PathLike) -> None:
    target = path(p)
    if target.exists():
        target.rmtree()


def copy_tree(src: str, dst: str, last: tuple[str, ...] = ()) -> None:
    """Copies a file, or a folder with everything under it, from any storage to any storage.
    In each folder the files named in `last` (marker files) are written after every other name,
    so a copy cut off never has a folder's marker without the folder's contents."""
    if not isdir(src):
        copy_file(src, dst)
        return
    makedirs(dst)
    for name in sorted(listdir(src), key=lambda n: n in last):
        copy_tree(join(src, name), join(dst, name), last)


def copy_file(src: str, dst: str) -> None:
    """Copies one file from any storage to any storage, streamed (epath copies 1 MB at a time),
    never whole in memory. Not atomic locally: a caller that needs a whole-or-nothing folder
    writes its marker last (copy_tree's `last`)."""
    if not is_remote(dst):
        makedirs(os.path.dirname(os.path.abspath(dst)))
    path(src).copy(path(dst), overwrite=True)


def download_dir(remote: str, local: str) -> None:
    """Copies a remote folder's files (flat) into a fresh local folder, atomically renamed in."""
    parent = os.path.dirname(os.path.abspath(local))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(local)}.", dir=parent)
    try:
        for child in path(remote).iterdir():
            child.copy(path(os.path.join(tmp, child.name)), overwrite=True)
        if os.path.isdir(local):
            path(local).rmtree()
        os.rename(tmp, local)
    except BaseException:
        if os.path.isdir(tmp):
            path(tmp).rmtree()
        raise


def is_disk_full(e: BaseException) -> bool:
    """An OSError saying the disk (or the user's quota on it) is full."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def bytes_on_disk(folder: str | os.PathLike) -> int:
    """The space the files below a local `folder` take (allocated blocks, as `du` counts them)."""
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except FileNotFoundError:  # deleted while walking (an old step being removed)
                pass
    return total


def free_bytes(p: str | os.PathLike) -> int | None:
    """Free bytes on the local filesystem holding `p` (or its nearest existing parent); None for
    object storage, which has no such number."""
    if is_remote(p):
        return None
    p = os.path.abspath(os.fspath(p))
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def scratch_dir() -> str:
    """A local folder for copies of remote files (TFM_JAX_SCRATCH, else ~/.cache/tfm_jax)."""
    return os.environ.get("TFM_JAX_SCRATCH") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfm_jax"
    )
