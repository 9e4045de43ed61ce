"""§5.1 token-budget batching: length buckets (or packed rows), per-epoch plans, host shards.

A split is tokenized once into flat int32 arrays. Each epoch's batches are a *plan* (lists of
pair indices per row) computed deterministically from (seed, epoch), so an iterator's position
is just (epoch, step) and resuming replays exactly the batches an uninterrupted run would see.
Every process computes the same global plan and materializes only its own rows.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import ml_collections
import numpy as np

from tfm_jax.data.sources import DataError, open_split
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.vocab_ids import EOS_ID, PAD_ID

log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]


def _round_up(x, m: int):
    return -(-np.asarray(x) // m) * m


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


def tokenize_split(
    cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, split: str, overlong: str
) -> TokenizedSplit:
    """Encodes a split, appends EOS, and drops or truncates pairs over cfg.max_len per side."""
    if overlong not in ("drop", "truncate"):
        raise DataError(f'data.overlong={overlong!r}: expected "drop" or "truncate".')
    if cfg.max_len < 2:
        raise DataError(f"data.max_len={cfg.max_len}: needs room for a token and EOS (>= 2).")
    keep = cfg.max_len - 1  # room for EOS
    src_parts, tgt_parts, src_lens, tgt_lens, index = [], [], [], [], []
    n_seen = n_over = 0
    for src_text, tgt_text in open_split(cfg, split).iter_chunks(50_000):
        for s, t in zip(
            tokenizer.encode_batch(src_text), tokenizer.encode_batch(tgt_text), strict=True
        ):
            if len(s) > keep or len(t) > keep:
                n_over += 1
                if overlong == "drop":
                    n_seen += 1
                    continue
                s, t = s[:keep], t[:keep]
            src_parts.append(s)
            tgt_parts.append(t)
            src_lens.append(len(s) + 1)
            tgt_lens.append(len(t) + 1)
            index.append(n_seen)
            n_seen += 1
    if n_over:
        log.warning(
            "%s: %s %d of %d pairs longer than data.max_len=%d tokens (incl. EOS)",
            split,
            "dropped" if overlong == "drop" else "truncated",
            n_over,
            n_seen,
            cfg.max_len,
        )
    if not index:
        raise DataError(
            f"split {split!r}: no pair fits data.max_len={cfg.max_len}; raise it or set "
            f"data.overlong=truncate."
        )

    def flat(parts, lens):
        offsets = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        ids = np.full(offsets[-1], EOS_ID, np.int32)
        for p, start in zip(parts, offsets[:-1].tolist(), strict=True):
            ids[start : start + len(p)] = p
        return ids, offsets

    src_ids, src_off = flat(src_parts, src_lens)
    tgt_ids, tgt_off = flat(tgt_parts, tgt_lens)
    return TokenizedSplit(src_ids, src_off, tgt_ids, tgt_off, np.asarray(index, np.int64))


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


# ----------------------------------------------------------------------------- batches


def materialize(
    split: TokenizedSplit, rows: Sequence[Sequence[int]], src_len: int, tgt_len: int, packed: bool
) -> Batch:
    """Fills [len(rows), S] / [len(rows), T] arrays; each row's pairs are laid end to end."""
    b = len(rows)
    batch = {
        "inputs": np.full((b, src_len), PAD_ID, np.int32),
        "targets": np.full((b, tgt_len), PAD_ID, np.int32),
    }
    if packed:
        for side, n in (("inputs", src_len), ("targets", tgt_len)):
            batch[f"{side}_segmentation"] = np.zeros((b, n), np.int32)
            batch[f"{side}_position"] = np.zeros((b, n), np.int32)
    for r, row in enumerate(rows):
        for side, get in (("inputs", split.src), ("targets", split.tgt)):
            pos = 0
            for seg, i in enumerate(row, start=1):
                ids = get(i)
                end = pos + len(ids)
                batch[side][r, pos:end] = ids
                if packed:
                    batch[f"{side}_segmentation"][r, pos:end] = seg
                    batch[f"{side}_position"][r, pos:end] = np.arange(len(ids))
                pos = end
    return batch


def _local_rows(rows: list, process_index: int, process_count: int) -> list:
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} not in [0, process_count={process_count})."
        )
    local = len(rows) // process_count
    return rows[process_index * local : (process_index + 1) * local]


class TrainIterator:
    """Infinite iterator of local training batches; position = (epoch, step), JSON-serializable."""

    def __init__(
        self,
        cfg: ml_collections.ConfigDict,
        tokenizer: Tokenizer,
        *,
        seed: int,
        batch_multiple: int = 1,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if batch_multiple < 1 or process_count < 1:
            raise ValueError(
                f"batch_multiple={batch_multiple}, process_count={process_count}: need >= 1"
            )
        self.seed = int(seed)
        self.packing = bool(cfg.packing)
        self.process_index, self.process_count = process_index, process_count
        _local_rows([], process_index, process_count)  # validates the index
        self.split = tokenize_split(cfg, tokenizer, cfg.train_split, cfg.overlong)
        unit = batch_multiple * process_count
        if self.packing:
            self.packed = packed_shape(self.split, cfg, unit)
            self.shapes = [(self.packed.src_len, self.packed.tgt_len)]
        else:
            self.buckets, self.which = make_buckets(self.split, cfg, unit)
            self.shapes = [(b.src_len, b.tgt_len) for b in self.buckets]
        self.epoch, self.step = 0, 0
        self._plan_epoch, self._plan = -1, []
        log.info(
            "train: %d pairs, global batch shapes (rows, S, T) %s",
            len(self.split),
            self.global_shapes(),
        )

    def global_shapes(self) -> list[tuple[int, int, int]]:
        if self.packing:
            return [(self.packed.batch_size, self.packed.src_len, self.packed.tgt_len)]
        return [(b.batch_size, b.src_len, b.tgt_len) for b in self.buckets]

    def plan(self, epoch: int) -> Plan:
        """Global batches of `epoch`: a pure function of (data, config, seed, epoch)."""
        if epoch != self._plan_epoch:
            rng = np.random.default_rng([self.seed, epoch])  # each epoch reshuffled
            order = rng.permutation(len(self.split))
            if self.packing:
                self._plan = pack_plan(self.split, self.packed, order, rng)
            else:
                self._plan = bucket_plan(self.buckets, self.which, order, rng)
            self._plan_epoch = epoch
        return self._plan

    @property
    def batches_per_epoch(self) -> int:
        return len(self.plan(self.epoch))

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        plan = self.plan(self.epoch)
        shape_id, rows = plan[self.step]
        s, t = self.shapes[shape_id]
        batch = materialize(
            self.split,
            _local_rows(rows, self.process_index, self.process_count),
            s,
            t,
            self.packing,
        )
        self.step += 1
        if self.step == len(plan):
            self.epoch, self.step = self.epoch + 1, 0
        return batch

    def get_state(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "seed": self.seed,
            "num_pairs": len(self.split),
            "packing": self.packing,
        }

    def set_state(self, state: dict) -> None:
        mine = self.get_state()
        for k in ("seed", "num_pairs", "packing"):
            if state[k] != mine[k]:
                raise ValueError(
                    f"iterator state has {k}={state[k]!r} but this iterator has "
                    f"{mine[k]!r}: it was saved by a different data pipeline."
                )
        epoch, step = int(state["epoch"]), int(state["step"])
        if not 0 <= step < len(self.plan(epoch)):
            raise ValueError(
                f"iterator state step={step} is outside epoch {epoch}'s "
                f"{len(self.plan(epoch))} batches."
            )
        self.epoch, self.step = epoch, step


def make_train_iterator(
    cfg: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    *,
    seed: int,
    batch_multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
) -> TrainIterator:
    """Infinite, resumable iterator over this process's share of each global training batch."""
    return TrainIterator(
        cfg,
        tokenizer,
        seed=seed,
        batch_multiple=batch_multiple,
        process_index=process_index,
        process_count=process_count,
    )


def make_eval_batches(
    cfg: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    split: str,
    *,
    batch_multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
) -> list[Batch]:
    """Every pair of `split` exactly once (in load_split_texts order within each bucket).

    Never drops: pairs over data.max_len are truncated (counted in the log). All-PAD filler rows
    keep the bucket shapes fixed; they carry no target tokens.
    """
    data = tokenize_split(cfg, tokenizer, split, "truncate")
    buckets, which = make_buckets(data, cfg, batch_multiple * process_count, tight=True)
    plan = bucket_plan(buckets, which, np.arange(len(data)), rng=None)
    return [
        materialize(
            data,
            _local_rows(rows, process_index, process_count),
            buckets[b].src_len,
            buckets[b].tgt_len,
            packed=False,
        )
        for b, rows in plan
    ]


def padding_efficiency(batches: Sequence[Batch]) -> dict:
    """Real (non-PAD) tokens over padded slots, per side and both sides together."""
    real = {"inputs": 0, "targets": 0}
    slots = {"inputs": 0, "targets": 0}
    for batch in batches:
        for side in real:
            real[side] += int(np.count_nonzero(batch[side] != PAD_ID))
            slots[side] += batch[side].size
    shapes = {(b["inputs"].shape, b["targets"].shape) for b in batches}
    return {
        "padding_efficiency": (real["inputs"] + real["targets"]) / max(1, sum(slots.values())),
        "inputs_efficiency": real["inputs"] / max(1, slots["inputs"]),
        "targets_efficiency": real["targets"] / max(1, slots["targets"]),
        "distinct_shapes": len(shapes),
        "num_batches": len(batches),
        "real_tokens": real["inputs"] + real["targets"],
    }


def timed_epoch(it: TrainIterator) -> tuple[list[Batch], float]:
    """One full epoch of batches from the iterator's current position, and the seconds taken."""
    start = time.perf_counter()
    batches = [next(it) for _ in range(it.batches_per_epoch - it.step)]
    return batches, time.perf_counter() - start
