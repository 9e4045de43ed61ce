"""§5.1 token-budget batching: plans materialized as host-sharded, resumable train/eval batches.

A split is tokenized once into flat int32 arrays (tokenized.py); the training split through the
token cache (token_cache.py), memory-mapped by later starts and hosts. Each epoch's batches
are a *plan* (flat arrays of pair indices per row, plans.py) computed from the pairs' lengths
alone and deterministically from (seed, epoch), so an iterator's position is just (epoch, step)
and resuming replays exactly the batches an uninterrupted run would see. Every process computes
the same global plan (O(pairs) numpy, ~16 bytes a pair) and reads and pads only its own rows.

Why not grain (0.2.x). Its `MapDataset` over an `ArrayRecordDataSource` gives index shuffling,
per-host slicing and checkpointable iterators, which this module also has in ~250 lines; what
it lacks is the batching §5.1 asks for. A batch here is a token budget (~25k tokens a side),
not a row count: length buckets whose row counts differ per bucket, or rows packed by first
fit over a window of pairs. grain's `FirstFitPackIterDataset` packs each host's own stream
in an `IterDataset`: a global batch is then whatever each host's packer held, and its resume
state is the packer's buffer plus the upstream position rather than two integers. The plan here
is a pure function of (data, config, rows' rounding unit, seed, epoch), so every host, every
resume and every rerun agrees on the same global batches (the unit, batch_multiple x
process_count, rounds each shape's row count), and the set of batch shapes is known up front (a
handful of XLA compilations). A grain `MapDataset` over precomputed plan rows would be this
module behind a wrapper; its multiprocessing prefetch is not needed while one process reads
~2,700 batches/s of 25k tokens at WMT scale (experiments/results/input_scale.md), far above any
device's step rate on the base model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ml_collections
import numpy as np

from tfm_jax.data.bpe_dropout import BpeDropout
from tfm_jax.data.plans import (
    Plan,
    bucket_plan,
    check_process,
    make_buckets,
    pack_plan,
    packed_shape,
)
from tfm_jax.data.sources import load_split_texts
from tfm_jax.data.token_cache import cached_tokenize_split
from tfm_jax.data.tokenized import TokenizedSplit, split_of, tokenize_split, tokens_kept
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.vocab_ids import PAD_ID

log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]

_SEGMENTATION_STREAM = 1  # BPE-dropout's seed: (seed, epoch, this), apart from the shuffle's


# ----------------------------------------------------------------------------- batches


def materialize(
    split: TokenizedSplit,
    counts: np.ndarray,
    pairs: np.ndarray,
    src_len: int,
    tgt_len: int,
    packed: bool,
) -> Batch:
    """Fills [rows, S] / [rows, T] arrays: row r lays its counts[r] pairs (the next ones of
    `pairs`) end to end. Vectorized: one gather and one scatter a side, no loop over pairs."""
    b = len(counts)
    row_of = np.repeat(np.arange(b), counts)  # each pair's row
    first = np.cumsum(counts) - counts  # each row's first pair in `pairs`
    batch = {}
    for side, n, ids, offsets in (
        ("inputs", src_len, split.src_ids, split.src_offsets),
        ("targets", tgt_len, split.tgt_ids, split.tgt_offsets),
    ):
        starts = offsets[pairs]
        lens = offsets[pairs + 1] - starts
        before = np.concatenate([[0], np.cumsum(lens)])  # tokens of the batch before pair i
        in_row = before[:-1] - before[first][row_of]  # each pair's first slot in its row
        within = np.arange(before[-1]) - np.repeat(before[:-1], lens)  # token j of its pair
        dest = np.repeat(row_of * n + in_row, lens) + within
        out = np.full((b, n), PAD_ID, np.int32)
        out.reshape(-1)[dest] = ids[np.repeat(starts, lens) + within]
        batch[side] = out
        if packed:
            seg = np.zeros((b, n), np.int32)
            seg.reshape(-1)[dest] = np.repeat(np.arange(len(pairs)) - first[row_of] + 1, lens)
            pos = np.zeros((b, n), np.int32)
            pos.reshape(-1)[dest] = within
            batch[f"{side}_segmentation"], batch[f"{side}_position"] = seg, pos
    return batch


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
        check_process(process_index, process_count)  # before the tokenizing, not at batch 1
        self.split = cached_tokenize_split(
            cfg, tokenizer, cfg.train_split, cfg.overlong, process_index=process_index
        )
        unit = batch_multiple * process_count
        if self.packing:
            self.packed = packed_shape(self.split, cfg, unit)
            self.shapes = [(self.packed.src_len, self.packed.tgt_len)]
        else:
            self.buckets, self.which = make_buckets(self.split, cfg, unit)
            self.shapes = [(b.src_len, b.tgt_len) for b in self.buckets]
        self.bpe_dropout = float(cfg.bpe_dropout)
        if self.bpe_dropout:
            # The kept pairs' texts, re-segmented each epoch (_resample); the cached split
            # still gives the batch shapes and which pairs are kept.
            src, tgt = load_split_texts(cfg, cfg.train_split)
            index = self.split.pair_index.tolist()
            texts = [src[i] for i in index] + [tgt[i] for i in index]
            self._bpe_dropout = BpeDropout(tokenizer, texts)
            self._keep = tokens_kept(cfg, "truncate")
        self.epoch, self.step = 0, 0
        self._plan_epoch, self._plan, self._plan_split = -1, None, self.split
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
            split, which = self.split, None if self.packing else self.which
            if self.bpe_dropout:
                split, which = self._resample(epoch)
            rng = np.random.default_rng([self.seed, epoch])  # each epoch reshuffled
            order = rng.permutation(len(split))
            if self.packing:
                self._plan = pack_plan(split, self.packed, order, rng)
            else:
                self._plan = bucket_plan(self.buckets, which, order, rng)
            self._plan_epoch, self._plan_split = epoch, split
        return self._plan

    def _resample(self, epoch: int) -> tuple[TokenizedSplit, np.ndarray | None]:
        """The training pairs BPE-dropout-segmented for `epoch` (a pure function of seed and
        epoch, so a resumed run sees the same tokens), and without packing each pair's bucket:
        the smallest whose shape holds it. A pair whose sampled segmentation fits no shape (or
        goes over data.max_len) keeps its deterministic one, which always fits: no text is cut
        and the batch shapes stay those of the deterministic segmentation."""
        start = time.perf_counter()
        rng = np.random.default_rng([self.seed, epoch, _SEGMENTATION_STREAM])
        ids = self._bpe_dropout.sample(self.bpe_dropout, rng)
        n = len(self.split)
        src, tgt = ids[:n], ids[n:]
        src_lens = np.fromiter(map(len, src), np.int64, n) + 1  # with EOS
        tgt_lens = np.fromiter(map(len, tgt), np.int64, n) + 1
        if self.packing:
            s_cap, t_cap = np.array([self.packed.src_len]), np.array([self.packed.tgt_len])
        else:
            s_cap = np.array([b.src_len for b in self.buckets])
            t_cap = np.array([b.tgt_len for b in self.buckets])
        s_cap, t_cap = np.minimum(s_cap, self._keep + 1), np.minimum(t_cap, self._keep + 1)
        fits = (src_lens[:, None] <= s_cap) & (tgt_lens[:, None] <= t_cap)
        kept = fits.any(1)
        for k in np.flatnonzero(~kept).tolist():
            src[k] = self.split.src(k)[:-1].tolist()  # without its EOS
            tgt[k] = self.split.tgt(k)[:-1].tolist()
        split = split_of(src, tgt, self._keep, self.split.pair_index)
        which = None
        if not self.packing:
            which = np.where(kept, fits.argmax(1), self.which)
        tokens = int(split.src_lens.sum() + split.tgt_lens.sum())
        plain = int(self.split.src_lens.sum() + self.split.tgt_lens.sum())
        log.info(
            "epoch %d: BPE-dropout %g segmentation in %.1f s: %d tokens (%.0f%% of the "
            "deterministic %d); %d pairs too long for the batch shapes kept their "
            "deterministic segmentation",
            epoch,
            self.bpe_dropout,
            time.perf_counter() - start,
            tokens,
            100 * tokens / plain,
            plain,
            n - int(kept.sum()),
        )
        return split, which

    @property
    def batches_per_epoch(self) -> int:
        return len(self.plan(self.epoch))

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        plan = self.plan(self.epoch)
        shape_id, counts, pairs = plan.local(self.step, self.process_index, self.process_count)
        s, t = self.shapes[shape_id]
        batch = materialize(self._plan_split, counts, pairs, s, t, self.packing)
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
    keep the bucket shapes fixed; they carry no target tokens. Evaluation splits are small
    (thousands of pairs): tokenized in memory at each start, not through the token cache.
    """
    data = tokenize_split(cfg, tokenizer, split, "truncate")
    buckets, which = make_buckets(data, cfg, batch_multiple * process_count, tight=True)
    plan = bucket_plan(buckets, which, np.arange(len(data)), rng=None)
    batches = []
    for k in range(len(plan)):
        b, counts, pairs = plan.local(k, process_index, process_count)
        bucket = buckets[b]
        batches.append(materialize(data, counts, pairs, bucket.src_len, bucket.tgt_len, False))
    return batches


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
