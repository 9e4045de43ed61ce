"""Tokenizes a split once into flat int32 id arrays plus per-pair offsets, EOS-terminated."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import math
import multiprocessing
import os
import sys
from collections.abc import Iterable, Sequence

import ml_collections
import numpy as np

from tfm_jax.data.sources import DataError, open_split
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.platform import storage
from tfm_jax.vocab_ids import EOS_ID

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
    """Kept pairs of a split as flat ids (each sequence ends in EOS) plus offsets."""

    src_ids: np.ndarray  # int32 [total source tokens]
    src_offsets: np.ndarray  # int64 [num_pairs + 1]
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    pair_index: np.ndarray  # int64 [num_pairs]: index in load_split_texts order

    def __len__(self) -> int:
        return len(self.pair_index)

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


@dataclasses.dataclass(frozen=True)
class EncodedChunk:
    """A chunk of a split's pairs, encoded: the kept pairs' flat ids (EOS appended), lengths."""

    src_ids: np.ndarray  # int32
    src_lens: np.ndarray  # int64 [kept pairs], EOS included
    tgt_ids: np.ndarray
    tgt_lens: np.ndarray
    index: np.ndarray  # int64 [kept pairs]: position of each kept pair within the chunk
    num_pairs: int  # pairs read, kept or not
    num_overlong: int  # pairs over the limit (dropped or truncated)


def tokens_kept(cfg: ml_collections.ConfigDict, overlong: str) -> int:
    """Tokens a side may keep before its EOS (data.max_len - 1), after checking the settings."""
    if overlong not in ("drop", "truncate"):
        raise DataError(f'data.overlong={overlong!r}: expected "drop" or "truncate".')
    if cfg.max_len < 2:
        raise DataError(f"data.max_len={cfg.max_len}: needs room for a token and EOS (>= 2).")
    return cfg.max_len - 1


def _flat(seqs: Sequence[list[int]], index: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    parts = [seqs[i] for i in index.tolist()]
    lens = np.fromiter(map(len, parts), np.int64, len(parts))
    if (lens > keep).any():
        parts, lens = [p[:keep] for p in parts], np.minimum(lens, keep)
    flat = np.fromiter(itertools.chain.from_iterable(parts), np.int32, int(lens.sum()))
    ids = np.full(len(flat) + len(parts), EOS_ID, np.int32)
    # Token j of pair k lands k slots later than in `flat`: one EOS per earlier pair.
    ids[np.arange(len(flat)) + np.repeat(np.arange(len(parts)), lens)] = flat
    return ids, lens + 1


def encode_chunk(
    tokenizer: Tokenizer,
    src_text: Sequence[str],
    tgt_text: Sequence[str],
    keep: int,
    overlong: str,
) -> EncodedChunk:
    """Encodes pairs, drops or truncates those with a side over `keep` tokens, appends EOS."""
    src, tgt = tokenizer.encode_batch(src_text), tokenizer.encode_batch(tgt_text)
    n = len(src)
    over = (np.fromiter(map(len, src), np.int64, n) > keep) | (
        np.fromiter(map(len, tgt), np.int64, n) > keep
    )
    index = np.flatnonzero(~over) if overlong == "drop" else np.arange(n, dtype=np.int64)
    src_ids, src_lens = _flat(src, index, keep)
    tgt_ids, tgt_lens = _flat(tgt, index, keep)
    return EncodedChunk(
        src_ids, src_lens, tgt_ids, tgt_lens, index.astype(np.int64), n, int(over.sum())
    )


def report_overlong(
    split: str, cfg: ml_collections.ConfigDict, overlong: str, n_over: int, n_seen: int, kept: int
) -> None:
    """Logs how many pairs went over data.max_len; raises DataError if none was kept."""
    if n_over:
        log.warning(
            "%s: %s %d of %d pairs longer than data.max_len=%d tokens (incl. EOS)",
            split,
            "dropped" if overlong == "drop" else "truncated",
            n_over,
            n_seen,
            cfg.max_len,
        )
    if not kept:
        raise DataError(
            f"split {split!r}: no pair fits data.max_len={cfg.max_len}; raise it or set "
            f"data.overlong=truncate."
        )


def summarize_chunks(
    split: str, cfg: ml_collections.ConfigDict, overlong: str, chunks: Sequence[EncodedChunk]
) -> tuple[np.ndarray, int, int]:
    """(pair_index, pairs over the limit, pairs read) of a split's chunks, reported as
    `report_overlong` does (raises DataError if no pair was kept)."""
    index = pair_index_of(chunks)
    n_over, n_seen = sum(c.num_overlong for c in chunks), sum(c.num_pairs for c in chunks)
    report_overlong(split, cfg, overlong, n_over, n_seen, len(index))
    return index, n_over, n_seen


def offsets_of(lens: Iterable[np.ndarray]) -> np.ndarray:
    """int64 offsets [n + 1] of sequences with these lengths (chunk by chunk), laid end to end."""
    lens = np.concatenate([np.zeros(1, np.int64), *lens])
    return np.cumsum(lens, out=lens)


def pair_index_of(chunks: Sequence[EncodedChunk]) -> np.ndarray:
    """Each kept pair's index in the whole split: its chunk's start plus its place in the chunk."""
    starts = np.cumsum([0] + [c.num_pairs for c in chunks])[:-1]
    parts = [c.index + s for c, s in zip(chunks, starts.tolist(), strict=True)]
    return np.concatenate([np.zeros(0, np.int64), *parts])


def tokenize_split(
    cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, split: str, overlong: str
) -> TokenizedSplit:
    """Encodes a split, appends EOS, and drops or truncates pairs over cfg.max_len per side."""
    keep = tokens_kept(cfg, overlong)
    chunks = [
        encode_chunk(tokenizer, src_text, tgt_text, keep, overlong)
        for src_text, tgt_text in open_split(cfg, split).iter_chunks(50_000)
    ]
    index, _, _ = summarize_chunks(split, cfg, overlong, chunks)
    return TokenizedSplit(
        np.concatenate([c.src_ids for c in chunks]),
        offsets_of(c.src_lens for c in chunks),
        np.concatenate([c.tgt_ids for c in chunks]),
        offsets_of(c.tgt_lens for c in chunks),
        index,
    )


def split_of(
    src: Sequence[list[int]], tgt: Sequence[list[int]], keep: int, pair_index: np.ndarray
) -> TokenizedSplit:
    """A TokenizedSplit of already encoded pairs (no EOS yet), each side cut to `keep` tokens
    before its EOS, with `pair_index` as the split they re-encode."""
    every = np.arange(len(src))
    src_ids, src_lens = _flat(src, every, keep)
    tgt_ids, tgt_lens = _flat(tgt, every, keep)
    return TokenizedSplit(
        src_ids, offsets_of([src_lens]), tgt_ids, offsets_of([tgt_lens]), pair_index
    )


# ----------------------------------------------------------------------------- in worker processes

_CHUNK_PAIRS = (256, 20_000)  # bounds on the pairs one worker task encodes
_POOL_MIN_PAIRS = 50_000  # fewer encode in ~2 s in-process, about what starting workers costs


@functools.lru_cache(maxsize=4)
def _worker_tokenizer(path: str | None, proto: bytes | None, digest: str) -> Tokenizer:
    """The tokenizer a worker process encodes with, loaded once a worker (a memo of its
    arguments: the vocabulary's content hash is part of the key)."""
    tok = Tokenizer.load(path) if path else Tokenizer(proto)
    if tok.content_hash != digest:
        raise DataError(
            f"{path}: the vocabulary file changed while the split was being tokenized; "
            "start again (it is never rewritten in place unless by hand)."
        )
    return tok


def _encode_in_worker(
    model: tuple[str | None, bytes | None, str], src: list[str], tgt: list[str], keep, overlong
) -> EncodedChunk:
    return encode_chunk(_worker_tokenizer(*model), src, tgt, keep, overlong)


def encode_split(
    cfg: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    split: str,
    overlong: str,
    num_workers: int,
) -> list[EncodedChunk]:
    """The split's chunks encoded in order: in `num_workers` processes when that is > 1 and the
    split is large enough to repay starting them.

    Each worker loads the sentencepiece model from its file (the proto when it has none) and
    encodes with one thread; at most 2 chunks per worker are in flight, so the text is not
    all queued at once.
    """
    keep = tokens_kept(cfg, overlong)
    pairs = open_split(cfg, split)
    workers = 1 if len(pairs) < _POOL_MIN_PAIRS else max(1, min(num_workers, os.cpu_count() or 1))
    size = min(_CHUNK_PAIRS[1], max(_CHUNK_PAIRS[0], math.ceil(len(pairs) / (4 * workers))))
    workers = max(1, min(workers, math.ceil(len(pairs) / size)))
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if workers > 1 and main_file and not storage.isfile(main_file):
        log.warning("tokenizing in this process: workers cannot import __main__ (%s)", main_file)
        workers = 1  # `python - < script`: forkserver's workers would fail to import "<stdin>"
    log.info(
        "tokenizing %r: %d pairs, %d process(es), chunks of %d", split, len(pairs), workers, size
    )
    if workers == 1:
        return [encode_chunk(tokenizer, s, t, keep, overlong) for s, t in pairs.iter_chunks(size)]
    proto = None if tokenizer.path else tokenizer.model_proto  # workers load the file if any
    model = (tokenizer.path, proto, tokenizer.content_hash)
    # Not "fork": the parent may hold JAX's threads. forkserver forks workers from a clean server.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    chunks, pending = [], collections.deque()
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            for s, t in pairs.iter_chunks(size):
                pending.append(pool.submit(_encode_in_worker, model, s, t, keep, overlong))
                if len(pending) >= 2 * workers:
                    chunks.append(pending.popleft().result())
            chunks += [f.result() for f in pending]
    except concurrent.futures.process.BrokenProcessPool as e:
        raise DataError(
            f"a tokenizer worker process died ({e}). Workers import the main script: a script "
            'that trains must guard its entry point with `if __name__ == "__main__":`. Or set '
            "data.num_workers=1 to tokenize in this process."
        ) from e
    return chunks
