"""Sentence-pair sources: local parallel-text folders and tfds catalog entries.

Both give a grain-style random-access source (`__len__`, `__getitem__` -> (source, target)
text), so tokenization and batching are shared. The folder path keeps the lines in memory
(`ParallelText`): Multi30k-sized folders load in milliseconds, and reading the raw files
ourselves lets every bad-input error name the file and line. tfds data is read with
`as_data_source` (array_record, no TensorFlow) and never held in memory as a whole.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

import ml_collections

from tfm_jax.config import paths
from tfm_jax.platform import storage

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad data or data configuration: the message names the file/line and the fix."""


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """In-memory sentence pairs (a grain `RandomAccessDataSource`)."""

    sources: Sequence[str]
    targets: Sequence[str]
    name: str = ""

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[str, str]:
        return self.sources[i], self.targets[i]

    def iter_chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        for start in range(0, len(self), size):
            yield list(self.sources[start : start + size]), list(self.targets[start : start + size])


class TfdsPairs:
    """A tfds array_record data source of {lang: bytes} dicts seen as (source, target) text."""

    def __init__(self, data_source, source_lang: str, target_lang: str, name: str = ""):
        self._ds = data_source
        self.source_lang = source_lang
        self.target_lang = target_lang
        self.name = name

    def __len__(self) -> int:
        return len(self._ds)

    def _pair(self, ex) -> tuple[str, str]:
        return _text(ex[self.source_lang]).strip(), _text(ex[self.target_lang]).strip()

    def __getitem__(self, i: int) -> tuple[str, str]:
        return self._pair(self._ds[i])

    def iter_chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        for start in range(0, len(self), size):
            exs = self._ds.__getitems__(list(range(start, min(start + size, len(self)))))
            pairs = [self._pair(ex) for ex in exs]
            # Empty sides are dropped here too, as in folders, so every source yields the same kind
            # of pairs.
            kept = [p for p in pairs if p[0] and p[1]]
            if len(kept) < len(pairs):
                log.warning(
                    "%s: dropped %d pairs with an empty side", self.name, len(pairs) - len(kept)
                )
            yield [p[0] for p in kept], [p[1] for p in kept]


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


# A split name, optionally sliced as tensorflow-datasets spells it: "train", "train[:50%]",
# "train[:14500]", "train[1000:2000]", "train[25%:]".
_SPLIT = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<start>\d+%?)?:(?P<stop>\d+%?)?\])?$")


def split_name(split: str) -> str:
    """The split a (possibly sliced) split string reads: "train[:50%]" -> "train"."""
    return _parse_split(split)[0]


def _parse_split(split: str) -> tuple[str, str | None, str | None]:
    m = _SPLIT.match(split.strip())
    if m is None:
        raise DataError(
            f"split {split!r}: expected a split name, optionally sliced as tensorflow-datasets "
            "spells it (train, train[:50%], train[:14500], train[1000:2000]); check "
            "data.train_split/eval_split/test_split."
        )
    return m["name"], m["start"], m["stop"]


def slice_bounds(split: str, n: int) -> tuple[int, int]:
    """[start, stop) of a sliced split over its n lines; percents rounded to the nearest line
    (as tensorflow-datasets rounds them)."""
    _, start, stop = _parse_split(split)

    def at(bound: str | None, default: int) -> int:
        if bound is None:
            return default
        if bound.endswith("%"):
            pct = int(bound[:-1])
            if pct > 100:
                raise DataError(f"split {split!r}: {bound} is over 100%.")
            return int(round(n * pct / 100))
        return min(int(bound), n)

    lo, hi = at(start, 0), at(stop, n)
    if lo >= hi:
        raise DataError(f"split {split!r} selects no line of its {n}: widen the slice.")
    return lo, hi


def open_split(cfg: ml_collections.ConfigDict, split: str) -> ParallelText | TfdsPairs:
    """Opens one split of the configured source: a random-access source of (source, target)."""
    if cfg.source_lang == cfg.target_lang:
        raise DataError(
            f"data.source_lang and data.target_lang are both {cfg.source_lang!r}; "
            "set two languages."
        )
    if cfg.source == "folder":
        return read_folder_split(cfg.dir, split, cfg.source_lang, cfg.target_lang)
    if cfg.source == "tfds":
        return open_tfds_split(cfg, split)
    raise DataError(f'data.source={cfg.source!r}: expected "folder" or "tfds".')


def load_split_texts(cfg: ml_collections.ConfigDict, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split in source order, pairs with an empty side left out.

    The same pairs, in the same order, as `make_eval_batches` covers (for decoding and BLEU).
    """
    src, tgt = [], []
    for s, t in open_split(cfg, split).iter_chunks(100_000):
        src += s
        tgt += t
    return src, tgt


def source_identity(cfg: ml_collections.ConfigDict, split: str) -> tuple[dict, list]:
    """(where a split's pairs come from, the state of those files), without reading them.

    A cache of anything derived from the split is keyed by the first and is stale when the
    second changes: a folder's two files' sizes and mtimes, or a tfds entry's prepared version
    directory (None while it is not prepared). Nothing is downloaded or opened here.
    """
    langs = [cfg.source_lang, cfg.target_lang]
    if cfg.source == "folder":
        where = paths.resolve(cfg.dir)
        state = []
        for lang in langs:
            name = f"{split_name(split)}.{lang}"
            state.append([name, *storage.file_state(storage.join(where, name))])
        return {"folder": where, "split": split, "langs": langs}, state
    if cfg.source == "tfds":
        data_dir = _tfds_data_dir(cfg)
        where = {"tfds": cfg.tfds_name, "data_dir": data_dir, "split": split, "langs": langs}
        return where, [_prepared_dir(data_dir, cfg.tfds_name)]
    return {"source": cfg.source, "split": split, "langs": langs}, []  # open_split says why not


# ----------------------------------------------------------------------------- folders


def _read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 file, whitespace-stripped (so CRLF and LF read the same)."""
    if not storage.isfile(path):
        raise DataError(f"{path}: file not found (expected one sentence per line).")
    data = storage.read_bytes(path)
    if not data.strip():
        raise DataError(f"{path}: the file is empty; it must hold one sentence per line.")
    raw = data.split(b"\n")  # bytes.split: unlike str.splitlines, no split at U+2028 etc.
    if raw[-1] == b"":
        raw.pop()
    lines = []
    for n, line in enumerate(raw, start=1):
        try:
            lines.append(line.decode("utf-8").strip())
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}:{n}: invalid UTF-8 ({e.reason} at byte {e.start} of the line); "
                f"re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or fix that line."
            ) from None
    return lines


def read_folder_split(folder: str, split: str, source_lang: str, target_lang: str) -> ParallelText:
    """Reads `{folder}/{split}.{source_lang}` and `.{target_lang}`, line N paired with line N.

    A sliced split (`train[:50%]`) keeps those lines of the files, before pairs with an empty
    side are dropped: the first half of the file's lines, whatever they hold.
    """
    name = split_name(split)
    files = [storage.join(folder, f"{name}.{lang}") for lang in (source_lang, target_lang)]
    for p in files:
        if not storage.isfile(p):
            have = storage.listdir(folder) if storage.isdir(folder) else None
            where = f"the folder holds {have}" if have is not None else f"{folder} does not exist"
            hint = ""
            if have is None:
                hint = (
                    " The quickstart expects Multi30k at ../shared/data/multi30k (relative to the "
                    "repository root; pass --config.data.dir=<folder>). To train on WMT14 through "
                    "tensorflow-datasets instead: --config=configs/base.py (data.source=tfds)."
                )
            raise DataError(
                f"{p}: file not found ({where}). Expected `{{split}}.{{lang}}` files; "
                f"check data.dir, the split name and data.source_lang/data.target_lang.{hint}"
            )
    src, tgt = _read_lines(files[0]), _read_lines(files[1])
    if len(src) != len(tgt):
        raise DataError(
            f"{files[0]} has {len(src)} lines but {files[1]} has {len(tgt)}: line N of one must "
            f"translate line N of the other (first line past the shorter file: "
            f"{min(len(src), len(tgt)) + 1}). Re-align the files."
        )
    if name != split:
        lo, hi = slice_bounds(split, len(src))
        src, tgt = src[lo:hi], tgt[lo:hi]
    keep = [i for i in range(len(src)) if src[i] and tgt[i]]
    if len(keep) < len(src):
        log.warning(
            "%s.{%s,%s}: dropped %d pairs with an empty side",
            storage.join(folder, split),
            source_lang,
            target_lang,
            len(src) - len(keep),
        )
        src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    if not src:
        raise DataError(f"{files[0]}: no pair has text on both sides.")
    return ParallelText(src, tgt, name=storage.join(folder, split))


# ----------------------------------------------------------------------------- tfds

# Catalog names whose builder class must be imported directly: with tfds 4.9 and no
# TensorFlow, `tfds.builder(name)` raises DatasetNotFoundError for them.
_TFDS_BUILDERS = {"wmt14_translate": ("tensorflow_datasets.translate.wmt14", "Wmt14Translate")}
# Most WMT14 archives come from here; if it does not answer, downloading cannot work.
_PROBE_URL = "https://www.statmt.org/"
_PROBE_TIMEOUT_S = 5.0


def _online(url: str = _PROBE_URL, timeout: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether `url` answers an HTTP request (any status) within `timeout` seconds.

    A real request rather than a TCP connect: sandboxes and proxies may accept connections
    they never serve.
    """
    result = []

    def probe():
        try:
            urllib.request.urlopen(
                urllib.request.Request(url, method="HEAD"), timeout=timeout
            ).close()
            result.append(True)
        except urllib.error.HTTPError:
            result.append(True)  # the server answered
        except (OSError, ValueError):
            result.append(False)

    # urlopen's timeout does not cover DNS resolution, hence the thread and join(timeout).
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def _tfds_data_dir(cfg: ml_collections.ConfigDict) -> str:
    if cfg.tfds_data_dir:
        return os.path.expanduser(cfg.tfds_data_dir)
    from tensorflow_datasets.core import constants

    return constants.DATA_DIR


def _prepared_dir(data_dir: str, tfds_name: str) -> str | None:
    """The newest `{data_dir}/{name}/{config}/{version}` holding a prepared dataset, or None."""
    base = storage.join(data_dir, tfds_name)
    if not storage.isdir(base):
        return None
    versions = [
        v
        for v in storage.listdir(base)
        if storage.isfile(storage.join(base, v, "dataset_info.json"))
    ]
    if not versions:
        return None
    versions.sort(key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))
    return storage.join(base, versions[-1])


def _offline_message(cfg: ml_collections.ConfigDict, data_dir: str, why: str) -> str:
    return (
        f"tfds dataset {cfg.tfds_name!r} is not prepared under "
        f"{os.path.join(data_dir, cfg.tfds_name)} and {why}. Either prepare it on a machine "
        f"with internet access (this code calls "
        f"download_and_prepare(file_format='array_record')) and point data.tfds_data_dir at it, or "
        f"read local parallel-text files instead: data.source=folder data.dir=/path/to/folder with "
        f"`{{split}}.{{lang}}` files (e.g. data.dir=../shared/data/wmt14-en-de, or the current "
        f"data.dir={cfg.dir!r})."
    )


def prepare_tfds(cfg: ml_collections.ConfigDict) -> str:
    """Returns the prepared dataset directory, downloading it first if needed and possible."""
    data_dir = _tfds_data_dir(cfg)
    found = _prepared_dir(data_dir, cfg.tfds_name)
    if found:
        return found
    name, _, config = cfg.tfds_name.partition("/")
    if name not in _TFDS_BUILDERS:
        raise DataError(
            _offline_message(
                cfg, data_dir, f"this code only knows how to download {sorted(_TFDS_BUILDERS)}"
            )
        )
    # Offline, tfds retries every download for minutes: fail in seconds instead.
    if not _online(_PROBE_URL, _PROBE_TIMEOUT_S):
        raise DataError(
            _offline_message(
                cfg,
                data_dir,
                f"the machine looks offline ({_PROBE_URL} did not answer within "
                f"{_PROBE_TIMEOUT_S:.0f} s)",
            )
        )
    module, cls = _TFDS_BUILDERS[name]
    builder = getattr(importlib.import_module(module), cls)(
        config=config or None, data_dir=data_dir
    )
    log.info("Downloading and preparing %s into %s", cfg.tfds_name, data_dir)
    builder.download_and_prepare(file_format="array_record")
    found = _prepared_dir(data_dir, cfg.tfds_name)
    if not found:
        raise DataError(
            f"download_and_prepare finished but no prepared {cfg.tfds_name} is under {data_dir}."
        )
    return found


def open_tfds_split(cfg: ml_collections.ConfigDict, split: str) -> TfdsPairs:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(prepare_tfds(cfg))
    if split_name(split) not in builder.info.splits:  # tfds reads the slice itself
        raise DataError(
            f"{builder.data_dir}: no split {split!r} (have {sorted(builder.info.splits)});"
            f" set data.train_split/eval_split/test_split to one of them."
        )
    ds = builder.as_data_source(split=split)
    if len(ds):
        have = set(ds[0])
        for lang in (cfg.source_lang, cfg.target_lang):
            if lang not in have:
                raise DataError(
                    f"{builder.data_dir}: no language {lang!r} (have {sorted(have)}); set "
                    f"data.source_lang/data.target_lang."
                )
    return TfdsPairs(ds, cfg.source_lang, cfg.target_lang, name=f"{builder.data_dir}[{split}]")
