"""§6.1 decoding: beam search and greedy search as pure functions over a logits callback.

Nothing here imports the model. The caller supplies

    tokens_to_logits(ids, cache) -> (logits, new_cache)

where `ids` is int32 [rows, 1] (the last token of every hypothesis, BOS at step 0), `logits` is
[rows, vocab] (unnormalized; log_softmax is applied here) and `cache` is any pytree (the Flax
"cache" collection). Every cache leaf with ndim >= 1 has leading dimension `rows`; 0-dim leaves
(e.g. a decode-step index shared by all rows) are passed through untouched. For beam search
rows = batch * beam, batch-major: [b0 beam0, b0 beam1, ..., b1 beam0, ...].

Paper settings (§6.1): beam size 4, length penalty alpha = 0.6, maximum output length = input
length + 50 (the caller passes it as `max_lengths`), early termination when possible.

Length convention: `length` of a hypothesis is the number of generated tokens excluding BOS and
including the final EOS, so `[w1, w2, EOS]` has length 3 and score
    sum_t log p(y_t | y_<t, x) / ((5 + 3) / 6) ** alpha.
A hypothesis that reaches its sentence's maximum length without EOS is finished there
("force-finished"): its length is max_length, its last token is whatever was chosen (no EOS is
appended) and it is scored like any other finished hypothesis.

Both searches are jit-compatible; batch_size, beam_size, alpha, max_decode_len and
early_stopping are Python values (static under jit), `max_lengths` may be traced.

Short buffers: `max_decode_len` (the size of the output buffer and of the caller's KV cache) may
be smaller than a sentence's `max_lengths`. The search then stops when the buffer is full, and a
sentence whose search had not ended by itself (EOS-terminated with nothing left that could beat
it, or its max length reached) comes back with `complete[b] = False`. Every complete sentence's
result is exactly what a search with a full-length buffer returns, since the two searches take
the same steps up to that point. Decoding with a short buffer first and again at full length
only for the incomplete sentences is therefore exact, and cheaper: the cache, its per-step beam
reorder and the attention over it all scale with the buffer length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID

Cache = Any
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]

# Finite, not -inf: scores of dead beams are added to and divided, and -inf - -inf would be NaN.
NEG_INF = -1.0e7


def mean_probability_logits(logits: Sequence[jax.Array]) -> jax.Array:
    """log(mean_i softmax(logits[i])) over the last axis: several models' next-token logits
    combined into the log of their mean probability (normalized log-probs, float32)."""
    logprobs = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
    return jax.nn.logsumexp(logprobs, axis=0) - math.log(len(logits))


def ensemble_tokens_to_logits(fns: Sequence[TokensToLogits]) -> TokensToLogits:
    """One TokensToLogits over several models: the log of their mean next-token probability.

    The cache is the tuple of the members' caches. Averaging probabilities (not log-probs) is
    what fairseq's ensemble does. A single member is returned as it is, so a one-model
    "ensemble" runs exactly the one model's program.
    """
    fns = tuple(fns)
    if not fns:
        raise ValueError("an ensemble needs at least one member")
    if len(fns) == 1:
        return fns[0]

    def tokens_to_logits(ids, caches):
        outs = [fn(ids, cache) for fn, cache in zip(fns, caches, strict=True)]
        logits = mean_probability_logits([x for x, _ in outs])  # [rows, vocab]
        return logits, tuple(cache for _, cache in outs)

    return tokens_to_logits


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT length penalty lp = ((5 + length) / 6) ** alpha (Wu et al. 2016), used by §6.1."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def expand_to_beams(tree: Cache, beam_size: int) -> Cache:
    """Repeats every leaf with ndim >= 1 beam_size times along axis 0 ([batch] -> [batch*beam]).

    Batch-major: row b*beam_size + k is beam k of sentence b. 0-dim leaves are returned as is.
    """

    def expand(x):
        x = jnp.asarray(x)
        return x if x.ndim == 0 else jnp.repeat(x, beam_size, axis=0)

    return jax.tree_util.tree_map(expand, tree)


def _take_beams(x: jax.Array, indices: jax.Array) -> jax.Array:
    """x[b, indices[b, j]] for x [batch, n, ...] and indices int32 [batch, m] -> [batch, m, ...]."""
    return x[jnp.arange(x.shape[0])[:, None], indices]


def gather_cache(
    cache: Cache,
    beam_indices: jax.Array,
    beam_size: int,
    beam_invariant: Callable[[tuple], bool] | None = None,
) -> Cache:
    """Reorders a [batch*beam, ...] cache: new beam j of sentence b is old beam_indices[b, j].

    0-dim leaves are shared by all rows and pass through unchanged, and so are leaves for which
    `beam_invariant(path)` is true: ones that hold the same values for every beam of a sentence
    (e.g. keys/values projected from the encoder output), where reordering is a costly no-op.
    """
    batch_size = beam_indices.shape[0]

    def gather(path, x):
        if x.ndim == 0 or (beam_invariant is not None and beam_invariant(path)):
            return x
        x = x.reshape((batch_size, beam_size) + x.shape[1:])  # [batch, beam, ...]
        x = _take_beams(x, beam_indices)  # [batch, new_beam, ...]
        return x.reshape((-1,) + x.shape[2:])  # [batch*new_beam, ...]

    return jax.tree_util.tree_map_with_path(gather, cache)


class BeamSearchOutput(NamedTuple):
    sequences: jax.Array  # int32 [batch, beam, max_decode_len]: best first, no BOS, EOS then PAD
    scores: jax.Array  # float32 [batch, beam]: length-penalized log-probs, NEG_INF if empty
    complete: jax.Array  # bool [batch]: the search ended by itself within the buffer


class GreedyOutput(NamedTuple):
    sequences: jax.Array  # int32 [batch, max_decode_len]: no BOS, EOS (or max length) then PAD
    complete: jax.Array  # bool [batch]: EOS or the max length was reached within the buffer


class _BeamState(NamedTuple):
    step: jax.Array  # int32 []: tokens generated so far (column `step` of *_seqs is the last one)
    live_logprobs: jax.Array  # [batch, beam] summed log-probs of unfinished prefixes, best first
    live_seqs: jax.Array  # [batch, beam, max_decode_len + 1]: BOS, tokens, then PAD
    finished_scores: jax.Array  # [batch, beam] length-penalized; NEG_INF for empty slots
    finished_seqs: jax.Array  # [batch, beam, max_decode_len + 1]
    finished_flags: jax.Array  # bool [batch, beam]: slot holds a real finished hypothesis
    cache: Cache  # leaves [batch*beam, ...] (or 0-dim)


def beam_search(
    tokens_to_logits: TokensToLogits,
    init_cache: Cache,
    *,
    batch_size: int,
    max_decode_len: int,
    max_lengths: jax.Array,
    beam_size: int = 4,
    alpha: float = 0.6,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    early_stopping: bool = True,
    exact_beams: str = "all",
    beam_invariant: Callable[[tuple], bool] | None = None,
) -> BeamSearchOutput:
    """§6.1 beam search with the GNMT length penalty and per-sentence maximum lengths.

    Args:
      tokens_to_logits: `(ids [batch*beam, 1], cache) -> (logits [batch*beam, vocab], cache)`.
      init_cache: cache for one hypothesis per sentence (leaves [batch, ...] or 0-dim); it is
        expanded to the beams here.
      batch_size: number of sentences.
      max_decode_len: static output buffer length; normally >= max(max_lengths). A shorter
        buffer stops the search when full (see "Short buffers" above).
      max_lengths: int32 [batch], maximum output length of each sentence (paper: input length
        + 50), at least 1.
      beam_size: number of hypotheses kept (paper: 4).
      alpha: length-penalty exponent (paper: 0.6); must be >= 0 for early stopping to be exact.
      early_stopping: stop a sentence once no live beam can beat its worst finished one. Turning
        it off only costs time; the result is the same (tested).
      exact_beams: "all" (the whole n-best list is exact) or "best": stop a sentence as soon as
        no live beam can beat its *best* finished hypothesis. The best sequence and score are
        then exactly those of a full search (tested), but lower-ranked beams may be missing or
        not the true runners-up. Translation keeps only the best, and stops much sooner.
      beam_invariant: `path -> bool` over cache leaves (jax key paths) that are the same for
        every beam of a sentence; they are not reordered (see gather_cache).

    Returns:
      BeamSearchOutput: sequences int32 [batch, beam, max_decode_len], best first, without BOS,
      each ending with EOS (or cut at its max length) followed by PAD; scores float32 [batch,
      beam], the length-penalized log-probabilities (NEG_INF for a slot that holds no
      hypothesis, which only happens when the vocabulary is smaller than the beam); complete
      bool [batch], False only for sentences cut short by a buffer shorter than max_lengths
      (their sequences and scores are then not meaningful).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if exact_beams not in ("all", "best"):
        raise ValueError(f"exact_beams must be 'all' or 'best', got {exact_beams!r}")
    if early_stopping and alpha < 0:
        # With alpha < 0 the penalty shrinks with length, so lp(max_length) no longer bounds
        # what a live beam can reach and stopping early could change the result.
        raise ValueError(f"early_stopping needs alpha >= 0, got {alpha}")

    max_lengths = jnp.maximum(jnp.asarray(max_lengths, jnp.int32), 1)  # [batch]
    # The best score a live prefix can still reach: its log-prob can only fall and the penalty
    # only grows with length (alpha >= 0), so divide by the penalty at the maximum length.
    max_penalty = length_penalty(max_lengths, alpha)[:, None]  # [batch, 1]

    seqs0 = jnp.full((batch_size, beam_size, max_decode_len + 1), pad_id, jnp.int32)
    seqs0 = seqs0.at[:, :, 0].set(bos_id)
    # Only beam 0 is alive at the start; the others would duplicate it.
    live0 = jnp.where(jnp.arange(beam_size) == 0, 0.0, NEG_INF)
    state = _BeamState(
        step=jnp.array(0, jnp.int32),
        live_logprobs=jnp.broadcast_to(live0, (batch_size, beam_size)).astype(jnp.float32),
        live_seqs=seqs0,
        finished_scores=jnp.full((batch_size, beam_size), NEG_INF, jnp.float32),
        finished_seqs=seqs0,
        finished_flags=jnp.zeros((batch_size, beam_size), bool),
        cache=expand_to_beams(init_cache, beam_size),
    )

    def searching(s: _BeamState) -> jax.Array:
        """bool [batch]: the sentence's search has not ended by itself."""
        row_active = s.step < max_lengths
        if early_stopping:
            best_live = s.live_logprobs[:, :1] / max_penalty  # [batch, 1]
            # Empty slots count as NEG_INF: a search with fewer than beam_size finished
            # hypotheses goes on, since any live beam that finishes would enter the top beams.
            finished = jnp.where(s.finished_flags, s.finished_scores, NEG_INF)
            if exact_beams == "all":
                bar = jnp.min(finished, axis=1, keepdims=True)  # the worst of the n-best
            else:
                bar = jnp.max(finished, axis=1, keepdims=True)  # only the best must be exact
            row_active &= ~jnp.all(bar > best_live, axis=1)
        return row_active

    def not_done(s: _BeamState) -> jax.Array:
        return (s.step < max_decode_len) & jnp.any(searching(s))

    def step_fn(s: _BeamState) -> _BeamState:
        last = lax.dynamic_index_in_dim(s.live_seqs, s.step, axis=2, keepdims=False)
        logits, cache = tokens_to_logits(last.reshape(batch_size * beam_size, 1), s.cache)
        vocab = logits.shape[-1]
        logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        logprobs = logprobs.reshape(batch_size, beam_size, vocab)
        candidates = s.live_logprobs[:, :, None] + logprobs  # [batch, beam, vocab]

        # 2*beam candidates always contain beam that do not end in EOS (each parent has one EOS).
        top_logprobs, top_flat = lax.top_k(
            candidates.reshape(batch_size, beam_size * vocab), 2 * beam_size
        )  # [batch, 2*beam]
        top_parents = top_flat // vocab
        top_tokens = (top_flat % vocab).astype(jnp.int32)
        top_seqs = _take_beams(s.live_seqs, top_parents)  # [batch, 2*beam, max_decode_len + 1]
        top_seqs = top_seqs.at[:, :, s.step + 1].set(top_tokens)

        length = s.step + 1  # tokens in each candidate, including the new one
        # A candidate grown from a dead beam (NEG_INF) is not a hypothesis.
        valid = top_logprobs > NEG_INF / 2
        ends = (top_tokens == eos_id) | (length >= max_lengths)[:, None]  # [batch, 2*beam]

        # Live: best beam candidates that go on.
        live_logprobs, live_idx = lax.top_k(jnp.where(ends, NEG_INF, top_logprobs), beam_size)
        live_seqs = _take_beams(top_seqs, live_idx)
        cache = gather_cache(cache, _take_beams(top_parents, live_idx), beam_size, beam_invariant)

        # Finished: best beam among the old finished and the candidates that end here.
        new_flags = ends & valid
        new_scores = jnp.where(new_flags, top_logprobs / length_penalty(length, alpha), NEG_INF)
        all_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)  # [batch, 3*beam]
        # Old hypotheses come first, so a tie keeps the earlier one (top_k prefers the lower index).
        finished_scores, fin_idx = lax.top_k(all_scores, beam_size)
        all_seqs = jnp.concatenate([s.finished_seqs, top_seqs], axis=1)
        all_flags = jnp.concatenate([s.finished_flags, new_flags], axis=1)

        return _BeamState(
            step=length,
            live_logprobs=live_logprobs,
            live_seqs=live_seqs,
            finished_scores=finished_scores,
            finished_seqs=_take_beams(all_seqs, fin_idx),
            finished_flags=_take_beams(all_flags, fin_idx),
            cache=cache,
        )

    final = lax.while_loop(not_done, step_fn, state)
    # Every sentence is force-finished at its max length, so finished slots are filled (up to
    # vocabulary size); empty slots keep NEG_INF and PAD.
    return BeamSearchOutput(final.finished_seqs[:, :, 1:], final.finished_scores, ~searching(final))


class _GreedyState(NamedTuple):
    step: jax.Array  # int32 []
    seqs: jax.Array  # [batch, max_decode_len + 1]: BOS, tokens, then PAD
    finished: jax.Array  # bool [batch]
    cache: Cache  # leaves [batch, ...] (or 0-dim)


def greedy_search(
    tokens_to_logits: TokensToLogits,
    init_cache: Cache,
    *,
    batch_size: int,
    max_decode_len: int,
    max_lengths: jax.Array,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
) -> GreedyOutput:
    """Argmax decoding: sequences int32 [batch, max_decode_len], without BOS, EOS (or max
    length) then PAD, and `complete` [batch] (False where a buffer shorter than max_lengths cut
    the sentence off; see "Short buffers" above).

    Same callback and cache contract as beam_search, with rows = batch. Finished sentences keep
    being fed PAD until every sentence is done.
    """
    max_lengths = jnp.maximum(jnp.asarray(max_lengths, jnp.int32), 1)  # [batch]
    seqs0 = jnp.full((batch_size, max_decode_len + 1), pad_id, jnp.int32).at[:, 0].set(bos_id)
    state = _GreedyState(
        step=jnp.array(0, jnp.int32),
        seqs=seqs0,
        finished=jnp.zeros((batch_size,), bool),
        cache=init_cache,
    )

    def not_done(s: _GreedyState) -> jax.Array:
        return (s.step < max_decode_len) & ~jnp.all(s.finished)

    def step_fn(s: _GreedyState) -> _GreedyState:
        last = lax.dynamic_index_in_dim(s.seqs, s.step, axis=1, keepdims=True)  # [batch, 1]
        logits, cache = tokens_to_logits(last, s.cache)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [batch]
        tokens = jnp.where(s.finished, pad_id, tokens)
        length = s.step + 1
        finished = s.finished | (tokens == eos_id) | (length >= max_lengths)
        return _GreedyState(length, s.seqs.at[:, length].set(tokens), finished, cache)

    final = lax.while_loop(not_done, step_fn, state)
    return GreedyOutput(final.seqs[:, 1:], final.finished)
