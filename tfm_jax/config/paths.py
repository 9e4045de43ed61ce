"""Paths the user types, resolved once at each entry point: local paths absolute, URLs as given.

Orbax (through TensorStore's OCDBT driver) refuses relative checkpoint paths, and a relative data
or vocabulary path in a saved config means something else when `evaluate` runs from another
directory. So every command resolves its path arguments and the config's path keys here, before
anything else reads them, and the saved config keeps both what was typed and what it became
(`cfg.paths`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

# Config keys that hold a local path or a URL. `paths.typed.<key with _ for .>` records the text
# the user gave, `paths.cwd` the directory it was resolved against.
CONFIG_PATH_KEYS = ("data.dir", "data.vocab_path", "data.tfds_data_dir", "data.token_cache_dir")


def is_url(path: str) -> bool:
    """`gs://bucket/x`, `s3://...`, `file:///...`: left as they are (epath and TensorStore)."""
    return "://" in path


def resolve(path: str | os.PathLike | None) -> str | None:
    """An absolute local path (`~` expanded) or the URL unchanged; None and "" stay as they are."""
    if path is None:
        return None
    path = os.fspath(path)
    if not path or is_url(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def relocated(path: str | None, old_workdir: str | None, new_workdir: str) -> str | None:
    """`path`, which a run recorded under its workdir `old_workdir`, at the same place under
    `new_workdir` if a file is there; else None. A workdir copied to another machine or renamed
    still finds its own files (the vocabulary a run pins is an absolute path under it)."""
    if not path or not old_workdir or is_url(path) or is_url(old_workdir):
        return None
    old, new = resolve(old_workdir), resolve(new_workdir)
    rel = os.path.relpath(resolve(path), old)
    if old == new or rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir:
        return None
    candidate = os.path.join(new, rel)
    return candidate if os.path.isfile(candidate) else None


def pinned_file(path: str, old_workdir: str | None, new_workdir: str) -> str | None:
    """A file a run pinned (a URL or an existing path, as it is), else where the moved workdir
    holds it (`relocated`, logged), else None: the caller says what is missing."""
    if is_url(path):
        from tfm_jax.platform import storage  # lazily: gcsfs only for a URL

        return path if storage.exists(path) else None
    if os.path.isfile(path):
        return path
    moved = relocated(path, old_workdir, new_workdir)
    if moved:
        log.info("%s is now %s (the workdir moved from %s)", path, moved, old_workdir)
    return moved


def _typed_key(dotted: str) -> str:
    return dotted.replace(".", "_")


def resolve_config_paths(cfg: Any, workdir: str | None = None) -> Any:
    """Makes `CONFIG_PATH_KEYS` absolute in place and records what was typed in `cfg.paths`.

    A path that is already absolute (a saved run's config, read back) is left alone and its
    earlier record kept, so resolving twice changes nothing. `workdir` (as typed) is recorded
    with the config of a run being trained.
    """
    changed = False
    for dotted in CONFIG_PATH_KEYS:
        section, key = dotted.split(".")
        typed = cfg[section][key]
        resolved = resolve(typed)
        if resolved != typed:
            cfg[section][key] = resolved
            cfg.paths.typed[_typed_key(dotted)] = typed
            changed = True
    if workdir is not None:
        cfg.paths.typed.workdir = os.fspath(workdir)
        cfg.paths.workdir = resolve(workdir)
        changed = True
    if changed:
        cfg.paths.cwd = os.getcwd()
    return cfg


def resolve_args(args: Any, names: tuple[str, ...] = ("workdir", "out", "input", "output")) -> Any:
    """Resolves the path arguments of an argparse namespace in place (those it has and are set).

    The text the user typed for `--workdir` stays available as `args.workdir_typed`.
    """
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            if name == "workdir":
                args.workdir_typed = value
            setattr(args, name, resolve(value))
    return args
