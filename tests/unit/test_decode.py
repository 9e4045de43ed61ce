"""Beam search and greedy search on hand-made models, checked against numpy references.

The toy model is a table of logits indexed by (sentence, number of A tokens fed so far, step,
previous token). The "number of A tokens" lives in a per-hypothesis cache leaf [batch*beam], so a
wrong cache reorder changes the logits; the step is a 0-dim cache leaf shared by all rows.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfm_jax.decode import search
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID

VOCAB = 6
A, B = 4, 5  # the two ordinary tokens; PAD, EOS, BOS, UNK are 0..3
N_COUNTS, N_STEPS = 3, 4  # table sizes; larger counts / steps reuse the last entry


def make_tokens_to_logits(tables):
    """tables: [batch, N_COUNTS, N_STEPS, VOCAB (previous token), VOCAB] logits."""

    def tokens_to_logits(ids, cache):
        prev = ids[:, 0]  # [rows]
        count = jnp.minimum(cache["state"]["count_a"], N_COUNTS - 1)
        step = jnp.minimum(cache["state"]["index"], N_STEPS - 1)
        logits = tables[cache["row"], count, step, prev]  # [rows, VOCAB]
        new_cache = {
            "row": cache["row"],
            "state": {
                "count_a": cache["state"]["count_a"] + (prev == A),
                "index": cache["state"]["index"] + 1,
            },
        }
        return logits, new_cache

    return tokens_to_logits


def init_cache(batch_size, rows=None):
    rows = jnp.arange(batch_size) if rows is None else jnp.asarray(rows)
    return {
        "row": rows.astype(jnp.int32),
        "state": {"count_a": jnp.zeros(batch_size, jnp.int32), "index": jnp.array(0, jnp.int32)},
    }


@functools.partial(
    jax.jit,
    static_argnames=("beam_size", "alpha", "max_decode_len", "early_stopping", "exact_beams"),
)
def run_beam_output(
    tables, rows, max_lengths, *, beam_size, alpha, max_decode_len, early_stopping=True,
    exact_beams="all",
):  # fmt: skip
    """The whole BeamSearchOutput. The tables are an argument, not a constant, so that tables
    of one shape (each test's seeds) share one program per setting."""
    return search.beam_search(
        make_tokens_to_logits(tables),
        init_cache(rows.shape[0], rows),
        batch_size=rows.shape[0],
        max_decode_len=max_decode_len,
        max_lengths=max_lengths,
        beam_size=beam_size,
        alpha=alpha,
        early_stopping=early_stopping,
        exact_beams=exact_beams,
    )


def run_beam(tables, rows, max_lengths, **kwargs):
    """(sequences, scores); every test that uses it has a full-length buffer."""
    return run_beam_output(tables, rows, max_lengths, **kwargs)[:2]


@functools.partial(jax.jit, static_argnames=("max_decode_len",))
def run_greedy(tables, rows, max_lengths, *, max_decode_len):
    return search.greedy_search(
        make_tokens_to_logits(tables),
        init_cache(rows.shape[0], rows),
        batch_size=rows.shape[0],
        max_decode_len=max_decode_len,
        max_lengths=max_lengths,
    ).sequences


# ---- numpy references -------------------------------------------------------------------------


def np_logprobs(tables, row, prefix):
    """log p(. | prefix) of the toy model, in float64, by replaying the prefix. A tuple of tables
    is an ensemble: the log of its members' mean probability."""
    if isinstance(tables, tuple):
        members = [np_logprobs(t, row, prefix) for t in tables]
        return np.logaddexp.reduce(members, axis=0) - np.log(len(members))
    fed = (BOS_ID,) + tuple(prefix)
    t = len(prefix)
    count = min(fed[:t].count(A), N_COUNTS - 1)
    logits = np.asarray(tables, np.float64)[row, count, min(t, N_STEPS - 1), fed[t]]
    return logits - np.logaddexp.reduce(logits)


def np_lp(length, alpha):
    return ((5 + length) / 6) ** alpha


def np_score(tables, row, seq, alpha):
    """Length-penalized score of a finished sequence (length counts the EOS, excludes BOS)."""
    logprob = sum(np_logprobs(tables, row, seq[:t])[seq[t]] for t in range(len(seq)))
    return logprob / np_lp(len(seq), alpha)


def np_beam_search(tables, row, max_len, beam_size, alpha):
    """Plain beam search: 2*beam candidates per step, no early stopping, lists of tuples."""
    live = [((), 0.0)]
    finished = []
    for step in range(max_len):
        cands = [
            (seq + (tok,), lp + lps[tok])
            for seq, lp in live
            for lps in [np_logprobs(tables, row, seq)]
            for tok in range(VOCAB)
        ]
        cands.sort(key=lambda c: -c[1])
        cands = cands[: 2 * beam_size]
        ends = [c[0][-1] == EOS_ID or step + 1 == max_len for c in cands]
        finished += [
            (seq, lp / np_lp(step + 1, alpha))
            for (seq, lp), e in zip(cands, ends, strict=True)
            if e
        ]
        finished = sorted(finished, key=lambda f: -f[1])[:beam_size]
        live = [c for c, e in zip(cands, ends, strict=True) if not e][:beam_size]
    return finished


def np_greedy(tables, row, max_len):
    seq = ()
    while len(seq) < max_len and (not seq or seq[-1] != EOS_ID):
        seq += (int(np.argmax(np_logprobs(tables, row, seq))),)
    return seq


def brute_force_best(tables, row, max_len, alpha):
    """Best finished sequence over all sequences: EOS-terminated up to max_len, or cut there."""
    best = None
    for length in range(1, max_len + 1):
        for body in itertools.product(range(VOCAB), repeat=length - 1):
            if EOS_ID in body:
                continue
            lasts = range(VOCAB) if length == max_len else [EOS_ID]
            for last in lasts:
                seq = body + (last,)
                score = np_score(tables, row, seq, alpha)
                if best is None or score > best[1]:
                    best = (seq, score)
    return best


def strip(seq):
    """Drops the PAD after EOS (or after a force-finished max-length sequence)."""
    seq = [int(t) for t in seq]
    return tuple(seq[: seq.index(EOS_ID) + 1] if EOS_ID in seq else [t for t in seq if t])


def random_tables(seed, batch_size, scale=2.0):
    rng = np.random.default_rng(seed)
    shape = (batch_size, N_COUNTS, N_STEPS, VOCAB, VOCAB)
    tables = (scale * rng.standard_normal(shape)).astype(np.float32)
    # Like a trained model, never emit PAD or BOS (so PAD in an output only means padding).
    tables[..., [PAD_ID, BOS_ID]] = -50.0
    return tables


def constant_tables(batch_size=1, fill=-1000.0):
    return np.full((batch_size, N_COUNTS, N_STEPS, VOCAB, VOCAB), fill, np.float32)


# ---- tests --------------------------------------------------------------------------------------


def test_length_penalty_golden():
    np.testing.assert_allclose(search.length_penalty(jnp.array(1), 0.6), 1.0, rtol=1e-6)
    np.testing.assert_allclose(search.length_penalty(jnp.array(7), 0.6), 2.0**0.6, rtol=1e-6)
    np.testing.assert_allclose(search.length_penalty(jnp.array(10), 0.0), 1.0)


def test_expand_to_beams_is_batch_major_and_keeps_scalars():
    tree = {"x": jnp.array([[1, 2], [3, 4]]), "i": jnp.array(7)}
    out = search.expand_to_beams(tree, 3)
    np.testing.assert_array_equal(out["x"], [[1, 2]] * 3 + [[3, 4]] * 3)
    assert out["i"].shape == () and int(out["i"]) == 7


def test_gather_cache_reorders_rows_and_keeps_scalars():
    cache = {"x": jnp.arange(6) * 10, "i": jnp.array(5)}  # batch 2, beam 3
    out = search.gather_cache(cache, jnp.array([[2, 2, 0], [1, 0, 0]]), beam_size=3)
    np.testing.assert_array_equal(out["x"], [20, 20, 0, 40, 30, 30])
    assert int(out["i"]) == 5


def test_finds_known_best_sequence_with_its_score():
    # Greedy takes A (logit 1.0 > 0.8), after which every continuation is unlikely; the best
    # sentence is [B, EOS]. Beam search must find it and score it like the brute force.
    t = constant_tables(fill=0.0)
    t[0, :, 0, BOS_ID] = [-9, -9, -9, -9, 1.0, 0.8]
    t[0, :, 1:, A] = [-9, 0.0, -9, 0.0, 0.0, 0.0]  # after A: EOS, UNK, A, B equally likely
    t[0, :, 1:, B] = [-9, 3.0, -9, -9, 0.0, 0.0]  # after B: EOS likely
    max_len, alpha = 4, 0.6
    best_seq, best_score = brute_force_best(t, 0, max_len, alpha)
    assert best_seq == (B, EOS_ID)
    seqs, scores = run_beam(
        jnp.asarray(t),
        jnp.array([0]),
        jnp.array([max_len]),
        beam_size=4,
        alpha=alpha,
        max_decode_len=6,
    )
    assert strip(seqs[0, 0]) == best_seq
    np.testing.assert_array_equal(seqs[0, 0], [B, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID])
    np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-5)
    # Greedy misses it, beam search does not.
    assert np_greedy(t, 0, max_len)[0] == A
    # Every returned beam is scored exactly as its sequence deserves, best first.
    for k in range(4):
        np.testing.assert_allclose(scores[0, k], np_score(t, 0, strip(seqs[0, k]), alpha), 1e-5)
    assert np.all(np.diff(np.asarray(scores[0])) <= 0)


@pytest.mark.parametrize("early_stopping", [True, False])
def test_matches_numpy_reference_per_sentence(early_stopping):
    # 3 sentences, each with its own table and max length, some shorter than max_decode_len.
    tables = random_tables(seed=0, batch_size=3)
    max_lengths = [2, 5, 7]
    alpha = 0.6
    seqs, scores = run_beam(
        jnp.asarray(tables),
        jnp.arange(3),
        jnp.array(max_lengths),
        beam_size=4,
        alpha=alpha,
        max_decode_len=8,
        early_stopping=early_stopping,
    )
    for b, max_len in enumerate(max_lengths):
        ref = np_beam_search(tables, b, max_len, beam_size=4, alpha=alpha)
        assert len(ref) == 4
        got = [strip(seqs[b, k]) for k in range(4)]
        assert got == [seq for seq, _ in ref], b
        np.testing.assert_allclose(scores[b], [s for _, s in ref], rtol=1e-5)
        # Per-sentence max length: nothing beyond it, PAD after.
        assert np.all(np.asarray(seqs[b, :, max_len:]) == PAD_ID)
        assert all(len(s) <= max_len for s in got)


def test_batch_rows_are_independent():
    tables = jnp.asarray(random_tables(seed=1, batch_size=3))
    max_lengths = jnp.array([3, 6, 4])
    kwargs = dict(beam_size=4, alpha=0.6, max_decode_len=6)
    seqs, scores = run_beam(tables, jnp.arange(3), max_lengths, **kwargs)
    for b in range(3):
        one_seqs, one_scores = run_beam(tables, jnp.array([b]), max_lengths[b : b + 1], **kwargs)
        np.testing.assert_array_equal(seqs[b], one_seqs[0])
        np.testing.assert_allclose(scores[b], one_scores[0], rtol=1e-6)


def test_force_finishes_at_max_length():
    # EOS is never likely: every hypothesis is cut at its sentence's max length, without EOS.
    tables = random_tables(seed=2, batch_size=2)
    tables[..., EOS_ID] = -50.0
    max_lengths = [2, 5]
    seqs, scores = run_beam(
        jnp.asarray(tables),
        jnp.arange(2),
        jnp.array(max_lengths),
        beam_size=4,
        alpha=0.6,
        max_decode_len=7,
    )
    seqs = np.asarray(seqs)
    for b, max_len in enumerate(max_lengths):
        assert np.all(seqs[b, :, :max_len] != PAD_ID) and np.all(seqs[b, :, max_len:] == PAD_ID)
        assert not np.any(seqs[b] == EOS_ID)
        for k in range(4):
            expected = np_score(tables, b, tuple(seqs[b, k, :max_len]), 0.6)
            np.testing.assert_allclose(scores[b, k], expected, rtol=1e-5)


def test_length_penalty_flips_choice_where_formula_says():
    # Two plausible sentences: short = [A, EOS] (length 2, log p_A) and long = [B, B, B, EOS]
    # (length 4, log p_B), everything else has probability ~e^-1000. Long wins iff
    #   log p_B / lp(4) > log p_A / lp(2)  <=>  alpha > log(log p_B / log p_A) / log(9 / 7).
    p_a = 0.52
    t = constant_tables()
    t[0, :, 0, BOS_ID, A] = math.log(p_a)
    t[0, :, 0, BOS_ID, B] = math.log(1 - p_a)
    t[0, :, 1, A, EOS_ID] = 0.0
    t[0, :, 1, B, B] = 0.0
    t[0, :, 2, B, B] = 0.0
    t[0, :, 3, B, EOS_ID] = 0.0
    threshold = math.log(math.log(1 - p_a) / math.log(p_a)) / math.log(9 / 7)
    assert 0.4 < threshold < 0.6  # so the paper's alpha prefers the long one, 0.4 the short one

    def best(alpha):
        seqs, scores = run_beam(
            jnp.asarray(t),
            jnp.array([0]),
            jnp.array([6]),
            beam_size=4,
            alpha=alpha,
            max_decode_len=6,
        )
        return strip(seqs[0, 0]), float(scores[0, 0])

    short, long = (A, EOS_ID), (B, B, B, EOS_ID)
    for alpha, expected in [
        (0.0, short),
        (round(threshold - 0.02, 4), short),
        (round(threshold + 0.02, 4), long),
        (0.6, long),
    ]:
        seq, score = best(alpha)
        assert seq == expected, (alpha, seq)
        np.testing.assert_allclose(score, np_score(t, 0, expected, alpha), rtol=1e-5)


def test_early_stopping_stops_early_and_changes_nothing():
    # EOS is likely, max lengths are long: the bound is met long before max_decode_len.
    tables = random_tables(seed=3, batch_size=2)
    tables[..., EOS_ID] += 3.0
    steps_run = []

    def counting(tokens_to_logits):
        def fn(ids, cache):
            jax.debug.callback(steps_run.append, cache["state"]["index"])
            return tokens_to_logits(ids, cache)

        return fn

    def run(early_stopping, exact_beams="all"):
        steps_run.clear()
        out = search.beam_search(
            counting(make_tokens_to_logits(jnp.asarray(tables))),
            init_cache(2),
            batch_size=2,
            max_decode_len=30,
            max_lengths=jnp.array([30, 25]),
            beam_size=4,
            alpha=0.6,
            early_stopping=early_stopping,
            exact_beams=exact_beams,
        )
        jax.effects_barrier()
        return out[:2], len(steps_run)

    (seqs_es, scores_es), n_es = run(True)
    (seqs_full, scores_full), n_full = run(False)
    assert n_full == 30 and n_es < 15
    np.testing.assert_array_equal(seqs_es, seqs_full)
    np.testing.assert_array_equal(scores_es, scores_full)
    # exact_beams="best": stops no later, and the best hypothesis is the full search's
    (seqs_b, scores_b), n_b = run(True, "best")
    assert n_b <= n_es
    np.testing.assert_array_equal(seqs_b[:, 0], seqs_full[:, 0])
    np.testing.assert_array_equal(scores_b[:, 0], scores_full[:, 0])


@pytest.mark.parametrize("seed", range(6))
def test_best_only_early_stopping_keeps_the_best(seed):
    # Random tables with a strong EOS, varied lengths: the best beam never changes.
    tables = random_tables(seed=10 + seed, batch_size=3)
    tables[..., EOS_ID] += 1.5 * (seed % 3)
    kw = dict(batch_size=3, max_decode_len=12, max_lengths=jnp.array([12, 7, 10]), beam_size=4)
    fn = make_tokens_to_logits(jnp.asarray(tables))
    full = search.beam_search(fn, init_cache(3), alpha=0.6, early_stopping=False, **kw)
    best = search.beam_search(fn, init_cache(3), alpha=0.6, exact_beams="best", **kw)
    np.testing.assert_array_equal(best[0][:, 0], full[0][:, 0])
    np.testing.assert_allclose(best[1][:, 0], full[1][:, 0], rtol=1e-6)


def test_beam_size_one_equals_greedy():
    # With alpha = 0 and EOS either the argmax or far below the runner-up, a beam of one is
    # greedy decoding. (Otherwise it may differ: an EOS ranked second is kept as a finished
    # hypothesis and can beat greedy's eventual sentence.)
    tables = random_tables(seed=4, batch_size=3)
    eos_is_best = tables.argmax(-1) == EOS_ID
    tables[..., EOS_ID] = np.where(eos_is_best, tables[..., EOS_ID], tables.min(-1) - 10.0)
    max_lengths = jnp.array([3, 6, 8])
    seqs, _ = run_beam(
        jnp.asarray(tables), jnp.arange(3), max_lengths, beam_size=1, alpha=0.0, max_decode_len=8
    )
    greedy = run_greedy(jnp.asarray(tables), jnp.arange(3), max_lengths, max_decode_len=8)
    np.testing.assert_array_equal(seqs[:, 0], greedy)
    for b in range(3):
        assert strip(greedy[b]) == np_greedy(tables, b, int(max_lengths[b]))


def test_greedy_respects_max_lengths_and_pads():
    tables = random_tables(seed=5, batch_size=2)
    tables[..., EOS_ID] = -50.0
    greedy = np.asarray(
        run_greedy(jnp.asarray(tables), jnp.arange(2), jnp.array([2, 4]), max_decode_len=5)
    )
    assert np.all(greedy[0, :2] != PAD_ID) and np.all(greedy[0, 2:] == PAD_ID)
    assert np.all(greedy[1, :4] != PAD_ID) and np.all(greedy[1, 4:] == PAD_ID)
    for b, max_len in enumerate([2, 4]):
        assert tuple(greedy[b, :max_len]) == np_greedy(tables, b, max_len)


def test_rejects_bad_arguments():
    kwargs = dict(batch_size=1, max_decode_len=3, max_lengths=jnp.array([3]))
    fn = make_tokens_to_logits(jnp.asarray(constant_tables()))
    with pytest.raises(ValueError, match="beam_size"):
        search.beam_search(fn, init_cache(1), beam_size=0, **kwargs)
    with pytest.raises(ValueError, match="alpha"):
        search.beam_search(fn, init_cache(1), alpha=-0.5, **kwargs)


@pytest.mark.parametrize("seed", range(4))
def test_short_buffer_is_exact_where_complete(seed):
    """A buffer shorter than max_lengths: every sentence it reports complete equals a full-buffer
    search, and once complete at some buffer length it stays complete at every longer one."""
    tables = random_tables(seed=20 + seed, batch_size=4)
    tables[..., EOS_ID] += 1.0 + seed % 2
    max_lengths = jnp.array([12, 9, 12, 5])
    fn = make_tokens_to_logits(jnp.asarray(tables))
    # jitted, the seeds sharing each buffer length's program (un-jitted, each seed's closure over
    # its tables compiled all 24 searches again)
    kw = dict(beam_size=4, alpha=0.6)
    for exact_beams in ("all", "best"):
        full = run_beam_output(
            tables, jnp.arange(4), max_lengths, max_decode_len=12, exact_beams=exact_beams, **kw
        )
        assert np.all(full.complete)
        flags = []
        for short_len in range(1, 12):
            short = run_beam_output(
                tables, jnp.arange(4), max_lengths, max_decode_len=short_len,
                exact_beams=exact_beams, **kw,
            )  # fmt: skip
            flags.append(np.asarray(short.complete))
            beams = slice(None) if exact_beams == "all" else slice(0, 1)  # what is exact
            for b in np.flatnonzero(short.complete):
                np.testing.assert_array_equal(
                    short.sequences[b, beams], full.sequences[b, beams, :short_len]
                )
                assert np.all(np.asarray(full.sequences[b, beams, short_len:]) == PAD_ID)
                np.testing.assert_allclose(short.scores[b, beams], full.scores[b, beams], rtol=1e-6)
        flags = np.stack(flags)  # [buffer length - 1, batch]
        assert np.all(flags[1:] >= flags[:-1])  # monotone in the buffer length
        assert flags.any() and (exact_beams == "best" or not flags.all())  # some cut off
        assert flags[4, 3]  # max length 5 is reached within a 5-token buffer
    # greedy: complete iff EOS or max length came within the buffer, and then equal
    full = run_greedy(jnp.asarray(tables), jnp.arange(4), max_lengths, max_decode_len=12)
    short = search.greedy_search(
        fn, init_cache(4), batch_size=4, max_decode_len=4, max_lengths=max_lengths
    )
    for b in range(4):
        ends = strip(full[b])
        assert bool(short.complete[b]) == (len(ends) <= 4)
        if short.complete[b]:
            np.testing.assert_array_equal(short.sequences[b], full[b, :4])


# ---- ensembles ----------------------------------------------------------------------------------


def test_ensemble_logits_are_the_log_of_the_mean_probability():
    rng = np.random.default_rng(3)
    a, b = (jnp.asarray(rng.standard_normal((2, VOCAB)), jnp.float32) for _ in range(2))
    fns = [lambda ids, c, x=x: (x + 0.0 * ids, c + 1) for x in (a, b)]  # noqa: B023
    ids = jnp.zeros((2, 1), jnp.int32)
    out, caches = search.ensemble_tokens_to_logits(fns)(ids, (jnp.array(0), jnp.array(10)))
    pa, pb = (np.exp(np.asarray(x, np.float64) - np.logaddexp.reduce(x, -1, keepdims=True))
              for x in (np.asarray(a, np.float64), np.asarray(b, np.float64)))  # fmt: skip
    np.testing.assert_allclose(np.asarray(out), np.log((pa + pb) / 2), rtol=1e-5, atol=1e-6)
    assert [int(c) for c in caches] == [1, 11]  # each member's cache, in order
    # One member is the member itself (its program unchanged); none is an error.
    assert search.ensemble_tokens_to_logits(fns[:1]) is fns[0]
    with pytest.raises(ValueError, match="at least one"):
        search.ensemble_tokens_to_logits([])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_ensemble_beam_search_matches_numpy_mixture(alpha):
    """Beam search over two toy models' ensemble == the numpy beam search over the mixture of
    their distributions, which neither member's own search gives."""
    t1, t2 = random_tables(seed=4, batch_size=3), random_tables(seed=5, batch_size=3)
    max_lengths = [3, 5, 6]

    @jax.jit
    def run(t1, t2):
        fn = search.ensemble_tokens_to_logits(
            [make_tokens_to_logits(t1), make_tokens_to_logits(t2)]
        )
        return search.beam_search(
            fn, (init_cache(3), init_cache(3)), batch_size=3, max_decode_len=6,
            max_lengths=jnp.array(max_lengths), beam_size=4, alpha=alpha,
        )[:2]  # fmt: skip

    seqs, scores = run(jnp.asarray(t1), jnp.asarray(t2))
    differs = 0
    for b, max_len in enumerate(max_lengths):
        ref = np_beam_search((t1, t2), b, max_len, beam_size=4, alpha=alpha)
        assert [strip(seqs[b, k]) for k in range(4)] == [seq for seq, _ in ref], b
        np.testing.assert_allclose(scores[b], [s for _, s in ref], rtol=1e-5)
        alone = [[q for q, _ in np_beam_search(t, b, max_len, 4, alpha)] for t in (t1, t2)]
        differs += [seq for seq, _ in ref] not in alone
    assert differs  # the mixture's n-best lists are not just one member's
