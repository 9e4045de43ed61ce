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


@dataclasses.dataclass(frozen=True)
class Plan:
    """An epoch's global batches as flat index arrays: ~16 bytes a pair, not Python lists.

    Batch k has shape id `shape_ids[k]` and the global rows `batch_rows[k]:batch_rows[k+1]`; row
    r lays the pairs `pairs[row_pairs[r]:row_pairs[r+1]]` end to end (one pair without packing,
    none for an all-PAD filler row). A process reads only its own slice of a batch's rows.
    """

    shape_ids: np.ndarray  # int32 [batches]
    batch_rows: np.ndarray  # int64 [batches + 1]
    row_pairs: np.ndarray  # int64 [rows + 1]
    pairs: np.ndarray  # int64 [pairs placed]

    def __len__(self) -> int:
        return len(self.shape_ids)

    def local(
        self, k: int, process_index: int = 0, process_count: int = 1
    ) -> tuple[int, np.ndarray, np.ndarray]:
        """Batch k's shape id, and `process_index`'s equal slice of its rows: each row's pair
        count and the rows' pairs end to end."""
        check_process(process_index, process_count)
        lo, hi = int(self.batch_rows[k]), int(self.batch_rows[k + 1])
        local = (hi - lo) // process_count
        lo += process_index * local
        offsets = self.row_pairs[lo : lo + local + 1]
        return int(self.shape_ids[k]), np.diff(offsets), self.pairs[offsets[0] : offsets[-1]]

    def rows(self, k: int, process_index: int = 0, process_count: int = 1):
        """`local` as a list of each row's pair indices (for reading a plan, not for speed)."""
        shape_id, counts, pairs = self.local(k, process_index, process_count)
        return shape_id, np.split(pairs, np.cumsum(counts)[:-1])


def check_process(process_index: int, process_count: int) -> None:
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} not in [0, process_count={process_count})."
        )


def permute_segments(
    flat: np.ndarray, lens: np.ndarray, perm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Segments of `flat` (lengths `lens`, end to end) reordered by `perm`, without a Python
    loop: (the reordered flat array, the reordered lengths)."""
    lens = np.asarray(lens, np.int64)
    starts = np.cumsum(lens) - lens
    new_lens = lens[perm]
    new_starts = np.cumsum(new_lens) - new_lens
    index = np.repeat(starts[perm] - new_starts, new_lens) + np.arange(int(new_lens.sum()))
    return flat[index], new_lens


def _plan(shape_ids: np.ndarray, batch_sizes: np.ndarray, row_lens: np.ndarray, pairs) -> Plan:
    return Plan(
        shape_ids=shape_ids.astype(np.int32),
        batch_rows=np.concatenate([[0], np.cumsum(batch_sizes)]).astype(np.int64),
        row_pairs=np.concatenate([[0], np.cumsum(row_lens)]).astype(np.int64),
        pairs=np.asarray(pairs, np.int64),
    )


def bucket_plan(
    buckets: Sequence[Bucket], which: np.ndarray, order: np.ndarray, rng: np.random.Generator | None
) -> Plan:
    """Pairs in `order`, grouped by bucket, cut into batches; batch order shuffled by `rng`.

    Vectorized over pairs: O(pairs) numpy work, no per-pair Python objects.
    """
    sizes = np.array([b.batch_size for b in buckets], np.int64)
    slots, shape_ids = [], []  # each bucket's rows in order, -1 for a filler row
    for b, size in enumerate(sizes.tolist()):
        members = order[which[order] == b]
        n = -(-len(members) // size)
        padded = np.full(n * size, -1, np.int64)
        padded[: len(members)] = members
        slots.append(padded)
        shape_ids.append(np.full(n, b, np.int64))
    slots_flat, shape_flat = np.concatenate(slots), np.concatenate(shape_ids)
    batch_sizes = sizes[shape_flat]
    if rng is not None:
        perm = rng.permutation(len(shape_flat))
        slots_flat, batch_sizes = permute_segments(slots_flat, batch_sizes, perm)
        shape_flat = shape_flat[perm]
    filled = slots_flat >= 0
    return _plan(shape_flat, batch_sizes, filled.astype(np.int64), slots_flat[filled])


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
    """First-fit-decreasing packing of pairs (in windows of `order`) into rows, then batches.

    First fit is sequential within a window (a Python loop over its pairs, each a vectorized
    search over the window's open rows); every window's rows go straight into flat arrays.
    """
    src_lens, tgt_lens = split.src_lens, split.tgt_lens
    row_pairs, row_lens = [], []
    for start in range(0, len(order), _PACK_WINDOW):
        window = order[start : start + _PACK_WINDOW]
        size = src_lens[window] / shape.src_len + tgt_lens[window] / shape.tgt_len
        window = window[np.argsort(-size, kind="stable")]
        free_s = np.empty(len(window), np.int64)
        free_t = np.empty(len(window), np.int64)
        row_of = np.empty(len(window), np.int64)  # each pair's row within the window
        n = 0
        lens = zip(src_lens[window].tolist(), tgt_lens[window].tolist(), strict=True)
        for j, (s, t) in enumerate(lens):
            fits = np.flatnonzero((free_s[:n] >= s) & (free_t[:n] >= t))
            if len(fits):
                r = fits[0]
            else:
                r, n = n, n + 1
                free_s[r], free_t[r] = shape.src_len, shape.tgt_len
            free_s[r] -= s
            free_t[r] -= t
            row_of[j] = r
        # A row's pairs in the order they were placed: stable sort by row.
        by_row = np.argsort(row_of, kind="stable")
        row_pairs.append(window[by_row])
        row_lens.append(np.bincount(row_of, minlength=n))
    pairs, lens = np.concatenate(row_pairs), np.concatenate(row_lens)
    pairs, lens = permute_segments(pairs, lens, rng.permutation(len(lens)))
    num_batches = -(-len(lens) // shape.batch_size)
    lens = np.concatenate([lens, np.zeros(num_batches * shape.batch_size - len(lens), np.int64)])
    return _plan(
        np.zeros(num_batches, np.int64), np.full(num_batches, shape.batch_size), lens, pairs
    )


# ----------------------------------------------------------------------------- without data


def config_shapes(cfg: ml_collections.ConfigDict, unit: int, packing: bool | None = None):
    """Global batch shapes [(rows, S, T)] from the data config alone, for compiling without the
    data (the `compile` command): the data's own shapes need its lengths (make_buckets).

    Packed: one row length of data.packed_length on both sides (the real short side is scaled
    down by the split's token ratio, packed_shape). Bucketed: data.num_buckets lengths spaced
    evenly up to data.max_len, the same length on both sides, each with the rows the token
    budget gives (the real bounds follow the length distribution). The longest shape is the
    worst case for memory: attention's B*L^2 = tokens_per_batch * L grows with L.
    """
    packing = cfg.packing if packing is None else packing
    m = cfg.length_multiple
    if packing:
        lengths = [int(_round_up(cfg.packed_length, m))]
    else:
        n = max(1, int(cfg.num_buckets))
        lengths = sorted({int(_round_up(-(-cfg.max_len * (i + 1) // n), m)) for i in range(n)})
    return [(_rows_for(length, cfg.tokens_per_batch, unit), length, length) for length in lengths]
