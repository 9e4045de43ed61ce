"""§5.1 batch planning: length buckets or packed rows, cut into per-epoch plans of pair indices."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import ml_collections
import numpy as np

from tfm_jax.data.sources import DataError
from tfm_jax.data.tokenized import TokenizedSplit


def _round_up(x, m: int):
    return -(-np.asarray(x) // m) * m


# ----------------------------------------------------------------------------- bucketing


@dataclasses.dataclass(frozen=True)
class Bucket:
    max_key: int  # pairs with max(src_len, tgt_len) <= max_key (and > the previous bucket's)
    src_len: int  # padded S
    tgt_len: int  # padded T
    batch_size: int  # global rows


def _boundaries(keys: np.ndarray, num_buckets: int, multiple: int) -> list[int]:
    """Bucket upper bounds (multiples of `multiple`) that minimize padded slots of `keys`.

    Exact dynamic programme over candidate bounds, cost = sum over pairs of (bound - key).
    """
    cands = np.unique(_round_up(keys, multiple))
    counts = np.array([np.sum(_round_up(keys, multiple) == c) for c in cands], np.float64)
    sums = np.array([np.sum(keys[_round_up(keys, multiple) == c]) for c in cands], np.float64)
    cc, cs = np.concatenate([[0], np.cumsum(counts)]), np.concatenate([[0], np.cumsum(sums)])
    k = len(cands)
    nb = min(num_buckets, k)
    # cost[i, j]: candidates i..j-1 in one bucket bounded by cands[j-1]
    inf = float("inf")
    best = np.full((nb + 1, k + 1), inf)
    arg = np.zeros((nb + 1, k + 1), np.int64)
    best[0, 0] = 0.0
    for b in range(1, nb + 1):
        for j in range(1, k + 1):
            i = np.arange(0, j)
            cost = best[b - 1, i] + (cc[j] - cc[i]) * cands[j - 1] - (cs[j] - cs[i])
            arg[b, j] = int(np.argmin(cost))
            best[b, j] = cost[arg[b, j]]
    b = int(np.argmin(best[1:, k])) + 1
    bounds, j = [], k
    while j > 0:
        bounds.append(int(cands[j - 1]))
        j, b = int(arg[b, j]), b - 1
    return sorted(bounds)


def _rows_for(length: int, tokens_per_batch: int, unit: int) -> int:
    rows = (tokens_per_batch // length) // unit * unit
    if rows == 0:
        raise DataError(
            f"data.tokens_per_batch={tokens_per_batch} cannot hold {unit} rows (batch_multiple x "
            f"process_count) of length {length}; raise tokens_per_batch or lower data.max_len / "
            f"data.packed_length."
        )
    return rows


def make_buckets(
    split: TokenizedSplit, cfg: ml_collections.ConfigDict, unit: int, tight: bool = False
) -> tuple[list[Bucket], np.ndarray]:
    """Buckets (padded shapes and row counts) and each pair's bucket number.

    `tight` caps a bucket's rows at its pair count (rounded up to `unit`): for one pass over a
    small split, so a bucket that fits one batch is not mostly filler rows.
    """
    src_lens, tgt_lens = split.src_lens, split.tgt_lens
    keys = np.maximum(src_lens, tgt_lens)
    bounds = _boundaries(keys, cfg.num_buckets, cfg.length_multiple)
    which = np.searchsorted(bounds, keys)  # first bound >= key
    buckets = []
    for b, bound in enumerate(bounds):
        m = which == b
        s = int(_round_up(src_lens[m].max(), cfg.length_multiple))
        t = int(_round_up(tgt_lens[m].max(), cfg.length_multiple))
        rows = _rows_for(max(s, t), cfg.tokens_per_batch, unit)
        if tight:
            rows = min(rows, int(_round_up(np.count_nonzero(m), unit)))
        buckets.append(Bucket(bound, s, t, rows))
    return buckets, which


# A plan is a list of batches; a batch is (shape id, rows); a row is a list of pair indices
# (one pair without packing; empty for an all-PAD filler row).
Plan = list[tuple[int, list[list[int]]]]


def bucket_plan(
    buckets: Sequence[Bucket], which: np.ndarray, order: np.ndarray, rng: np.random.Generator | None
) -> Plan:
    """Pairs in `order`, grouped by bucket, cut into batches; batch order shuffled by `rng`."""
    plan: Plan = []
    for b, bucket in enumerate(buckets):
        members = order[which[order] == b].tolist()
        for start in range(0, len(members), bucket.batch_size):
            rows = [[i] for i in members[start : start + bucket.batch_size]]
            rows += [[] for _ in range(bucket.batch_size - len(rows))]  # fixed shape: pad rows
            plan.append((b, rows))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


# ----------------------------------------------------------------------------- packing


@dataclasses.dataclass(frozen=True)
class PackedShape:
    src_len: int
    tgt_len: int
    batch_size: int


def packed_shape(split: TokenizedSplit, cfg: ml_collections.ConfigDict, unit: int) -> PackedShape:
    """Row lengths: packed_length for the side with more tokens, the other scaled to match."""
    src_total, tgt_total = int(split.src_lens.sum()), int(split.tgt_lens.sum())
    m = cfg.length_multiple
    long_len = int(_round_up(cfg.packed_length, m))
    ratio = min(src_total, tgt_total) / max(src_total, tgt_total)
    short_len = int(_round_up(np.ceil(long_len * ratio), m))
    s, t = (long_len, short_len) if src_total >= tgt_total else (short_len, long_len)
    s = max(s, int(_round_up(split.src_lens.max(), m)))
    t = max(t, int(_round_up(split.tgt_lens.max(), m)))
    return PackedShape(s, t, _rows_for(max(s, t), cfg.tokens_per_batch, unit))


_PACK_WINDOW = 8192  # pairs packed together; bounds the first-fit search per pair


def pack_plan(
    split: TokenizedSplit, shape: PackedShape, order: np.ndarray, rng: np.random.Generator
) -> Plan:
    """First-fit-decreasing packing of pairs (in windows of `order`) into rows, then batches."""
    src_lens, tgt_lens = split.src_lens, split.tgt_lens
    rows: list[list[int]] = []
    for start in range(0, len(order), _PACK_WINDOW):
        window = order[start : start + _PACK_WINDOW]
        size = src_lens[window] / shape.src_len + tgt_lens[window] / shape.tgt_len
        window = window[np.argsort(-size, kind="stable")]
        free_s = np.empty(len(window), np.int64)
        free_t = np.empty(len(window), np.int64)
        members: list[list[int]] = []
        for i in window.tolist():
            s, t = src_lens[i], tgt_lens[i]
            n = len(members)
            fits = np.flatnonzero((free_s[:n] >= s) & (free_t[:n] >= t))
            if len(fits):
                r = fits[0]
                members[r].append(i)
            else:
                r = n
                members.append([i])
                free_s[r], free_t[r] = shape.src_len, shape.tgt_len
            free_s[r] -= s
            free_t[r] -= t
        rows += members
    rows = [rows[i] for i in rng.permutation(len(rows))]
    plan: Plan = []
    for start in range(0, len(rows), shape.batch_size):
        chunk = rows[start : start + shape.batch_size]
        plan.append((0, chunk + [[] for _ in range(shape.batch_size - len(chunk))]))
    return plan
