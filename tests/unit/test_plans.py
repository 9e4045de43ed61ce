"""Batch plans as flat arrays: the same batches as the list-of-lists plans they replaced."""

from __future__ import annotations

import collections

import ml_collections
import numpy as np
import pytest

from tfm_jax.data.plans import bucket_plan, make_buckets, pack_plan, packed_shape
from tfm_jax.data.tokenized import TokenizedSplit

# ---- the list-based plans of commit 268fd7e, kept as the reference the arrays must equal ----


def reference_bucket_plan(buckets, which, order, rng):
    plan = []
    for b, bucket in enumerate(buckets):
        members = order[which[order] == b].tolist()
        for start in range(0, len(members), bucket.batch_size):
            rows = [[i] for i in members[start : start + bucket.batch_size]]
            rows += [[] for _ in range(bucket.batch_size - len(rows))]
            plan.append((b, rows))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


def reference_pack_plan(split, shape, order, rng, window_size=8192):
    src_lens, tgt_lens = split.src_lens, split.tgt_lens
    rows = []
    for start in range(0, len(order), window_size):
        window = order[start : start + window_size]
        size = src_lens[window] / shape.src_len + tgt_lens[window] / shape.tgt_len
        window = window[np.argsort(-size, kind="stable")]
        free_s, free_t, members = [], [], []
        for i in window.tolist():
            s, t = src_lens[i], tgt_lens[i]
            for r in range(len(members)):
                if free_s[r] >= s and free_t[r] >= t:
                    break
            else:
                r = len(members)
                members.append([])
                free_s.append(shape.src_len)
                free_t.append(shape.tgt_len)
            members[r].append(i)
            free_s[r] -= s
            free_t[r] -= t
        rows += members
    rows = [rows[i] for i in rng.permutation(len(rows))]
    plan = []
    for start in range(0, len(rows), shape.batch_size):
        chunk = rows[start : start + shape.batch_size]
        plan.append((0, chunk + [[] for _ in range(shape.batch_size - len(chunk))]))
    return plan


def as_lists(plan, process_index=0, process_count=1):
    out = []
    for k in range(len(plan)):
        shape_id, rows = plan.rows(k, process_index, process_count)
        out.append((shape_id, [r.tolist() for r in rows]))
    return out


def synthetic_split(n: int, seed: int = 0) -> TokenizedSplit:
    """Lengths like news text (EOS included), ids all zero: plans read only the lengths."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.0, 0.6, n).astype(np.int64), 2, 100)
    tgt = np.clip((src * rng.uniform(0.7, 1.4, n)).astype(np.int64), 2, 100)
    offsets = [np.concatenate([[0], np.cumsum(x)]) for x in (src, tgt)]
    return TokenizedSplit(
        src_ids=np.zeros(offsets[0][-1], np.int32),
        src_offsets=offsets[0],
        tgt_ids=np.zeros(offsets[1][-1], np.int32),
        tgt_offsets=offsets[1],
        pair_index=np.arange(n),
    )


def plan_cfg(tokens_per_batch=4096, packed_length=128) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "num_buckets": 8,
        "length_multiple": 8,
        "tokens_per_batch": tokens_per_batch,
        "packed_length": packed_length,
    })  # fmt: skip


@pytest.mark.parametrize("unit", [1, 4])
def test_bucket_plan_equals_list_reference(unit):
    split = synthetic_split(5000)
    buckets, which = make_buckets(split, plan_cfg(), unit)
    order = np.random.default_rng(1).permutation(len(split))
    got = bucket_plan(buckets, which, order, np.random.default_rng(2))
    want = reference_bucket_plan(buckets, which, order, np.random.default_rng(2))
    assert as_lists(got) == want
    # unshuffled (evaluation): buckets in order, pairs in `order` within each
    assert as_lists(bucket_plan(buckets, which, order, None)) == reference_bucket_plan(
        buckets, which, order, None
    )


def test_pack_plan_equals_list_reference():
    split = synthetic_split(20000)  # 3 windows of 8,192 pairs, the last one partial
    shape = packed_shape(split, plan_cfg(), 4)
    order = np.random.default_rng(3).permutation(len(split))
    got = pack_plan(split, shape, order, np.random.default_rng(4))
    want = reference_pack_plan(split, shape, order, np.random.default_rng(4))
    assert as_lists(got) == want
    # every pair exactly once, and no row over the packed lengths
    placed = collections.Counter(p for _, rows in want for row in rows for p in row)
    assert placed == collections.Counter(range(len(split)))
    for _, rows in want:
        for row in rows:
            assert split.src_lens[row].sum() <= shape.src_len
            assert split.tgt_lens[row].sum() <= shape.tgt_len


def test_process_slices_partition_each_batch():
    split = synthetic_split(3000)
    buckets, which = make_buckets(split, plan_cfg(), unit=4)
    plan = bucket_plan(buckets, which, np.arange(len(split)), np.random.default_rng(0))
    for k in range(len(plan)):
        shape_id, whole = as_lists(plan)[k]
        parts = [as_lists(plan, i, 4)[k] for i in range(4)]
        assert all(p[0] == shape_id for p in parts)
        assert sum((p[1] for p in parts), []) == whole
    with pytest.raises(ValueError, match="process_index=4"):
        plan.rows(0, 4, 4)


def test_plan_is_a_few_bytes_a_pair():
    """The list plans held ~130 bytes a pair in Python objects (0.60 GB at 4.5M pairs)."""
    split = synthetic_split(100_000)
    buckets, which = make_buckets(split, plan_cfg(tokens_per_batch=25_000), 1)
    rng = np.random.default_rng(0)
    plan = bucket_plan(buckets, which, rng.permutation(len(split)), rng)
    nbytes = sum(a.nbytes for a in (plan.shape_ids, plan.batch_rows, plan.row_pairs, plan.pairs))
    assert plan.pairs.size == len(split)
    assert nbytes / len(split) < 20  # pairs (8) + row offsets (8) + a little per batch
