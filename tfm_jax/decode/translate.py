"""§6.1 translation: text or ids in, batched beam (or greedy) search over the KV cache, text out.

The model and params come from decode/load.py; the search itself is decode/search.py (pure,
knows no model); evaluate a split with eval/evaluate.py.

Decoding batches are shaped for few compilations: sentences are sorted by length, the source
length is rounded up to a multiple of SRC_LEN_MULTIPLE, and each length bucket is cut into
batches of a fixed number of rows (cfg.decode.tokens_per_batch // padded length, rounded down
to a power of two). A bucket's last batch takes the next power of two >= its sentences, padded
with dummy rows, so a test set compiles about two shapes per length bucket and translating one
sentence does not run a full-size batch. jax.jit caches one program per (rows, source length,
max_decode_len, beam, alpha, greedy); a `DecodeStats` passed as `stats=` collects the distinct
ones a call asked for (and the sentences it decoded twice).

Two passes (decode.first_pass_extra_len): every batch is first decoded with an output buffer of
(padded source length + first_pass_extra_len) tokens, and only the sentences whose search had
not ended by then are decoded again with the full (source length + max_extra_len) buffer. The
result is exactly that of one full-length pass (search.py, "Short buffers"). On the quickstart
model no test sentence needed the second pass at 12 and beam-4 ran 1.28x faster.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.decode import search
from tfm_jax.model import attention
from tfm_jax.model.transformer import Transformer
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)

SRC_LEN_MULTIPLE = 16  # padded source lengths are multiples of this (one compile per bucket)


@dataclasses.dataclass
class DecodeStats:
    """What translate_ids calls did, for benchmarks and tests: pass one as `stats=` (it adds up
    over the calls it is passed to)."""

    # The distinct decoding programs asked for (jit compiles each once in a process), recorded
    # on the host before each call: (models, rows, source length, max_decode_len, beam, alpha,
    # greedy).
    programs: set[tuple] = dataclasses.field(default_factory=set)
    # Sentences a first, short-buffer pass (decode.first_pass_extra_len) left unfinished,
    # decoded again at full length.
    redecoded: int = 0


def init_cache(model: Transformer, params, encoded: jax.Array, inputs: jax.Array,
               max_decode_len: int):  # fmt: skip
    """Decoding cache for inputs.shape[0] rows: empty self-attention caches of max_decode_len
    positions and the encoder-decoder keys/values projected from `encoded`."""
    _, variables = model.apply(
        {"params": params},
        encoded,
        inputs,
        max_decode_len,
        method=Transformer.init_cache,
        mutable=["cache"],
    )
    return variables["cache"]


def mask_special_logits(logits: jax.Array) -> jax.Array:
    """PAD and BOS are never targets; the trained model gives them ~0 probability anyway, and a
    generated PAD would be masked out of a full (teacher-forced) decoder pass but not out of the
    cache, so excluding them keeps cached decoding equal to the full forward."""
    special = jnp.zeros(logits.shape[-1], bool).at[jnp.array([PAD_ID, BOS_ID])].set(True)
    return jnp.where(special, search.NEG_INF, logits)


def cached_tokens_to_logits(model: Transformer, params, encoded: jax.Array, inputs: jax.Array):
    """search.TokensToLogits over the model's KV cache (the "cache" collection)."""

    def tokens_to_logits(ids, cache):
        logits, mutated = model.apply(
            {"params": params, "cache": cache},
            encoded,
            inputs,
            ids,
            decode=True,
            mutable=["cache"],
            method=Transformer.decode,
        )
        return mask_special_logits(logits[:, 0]), mutated["cache"]

    return tokens_to_logits


def as_members(model, params) -> tuple[tuple[Transformer, ...], tuple[Any, ...]]:
    """(models, params) as tuples: one model and its params, or an ensemble's, member by member.

    translate_ids and translate_texts take either a Transformer and its params or sequences of
    them (an ensemble: decode/search.ensemble_tokens_to_logits averages their probabilities).
    """
    if isinstance(model, Transformer):
        return (model,), (params,)
    models, params = tuple(model), tuple(params)
    if not models or len(models) != len(params):
        raise ValueError(
            f"an ensemble needs one params tree per model: {len(models)} models, "
            f"{len(params)} params"
        )
    return models, params


@functools.partial(
    jax.jit, static_argnames=("models", "beam_size", "alpha", "max_decode_len", "greedy")
)
def _search(params, inputs, max_lengths, *, models, beam_size, alpha, max_decode_len, greedy):
    """Source ids [rows, S] -> (best output ids [rows, max_decode_len] (EOS, then PAD),
    complete [rows]: False where max_decode_len was too short for the search to end).

    `models` and `params` are tuples, one entry per ensemble member (one for a single model)."""
    rows = inputs.shape[0]
    members = tuple(zip(models, params, strict=True))
    encoded = [m.apply({"params": p}, inputs, method=Transformer.encode) for m, p in members]
    caches = [
        init_cache(m, p, e, inputs, max_decode_len)
        for (m, p), e in zip(members, encoded, strict=True)
    ]
    cache = caches[0] if len(caches) == 1 else tuple(caches)
    if not greedy:
        # The encoders ran once per sentence; their outputs are repeated for the beams.
        encoded, inputs = search.expand_to_beams((encoded, inputs), beam_size)
    fn = search.ensemble_tokens_to_logits(
        [
            cached_tokens_to_logits(m, p, e, inputs)
            for (m, p), e in zip(members, encoded, strict=True)
        ]
    )
    if greedy:
        return search.greedy_search(
            fn, cache, batch_size=rows, max_decode_len=max_decode_len, max_lengths=max_lengths
        )
    out = search.beam_search(
        fn,
        cache,
        batch_size=rows,
        max_decode_len=max_decode_len,
        max_lengths=max_lengths,
        beam_size=beam_size,
        alpha=alpha,
        exact_beams="best",  # only the best is kept: stop once nothing can beat it
        beam_invariant=attention.is_encoder_memory,
    )
    return out.sequences[:, 0], out.complete  # the best of each sentence


def source_limit(cfg: ml_collections.ConfigDict) -> int:
    """Longest source (tokens incl. EOS) the model takes: the data limit and the position table."""
    return min(cfg.data.max_len, cfg.model.max_len)


def _rows_per_batch(cfg: ml_collections.ConfigDict, src_len: int) -> int:
    rows = max(1, cfg.decode.tokens_per_batch // src_len)
    return 1 << (rows.bit_length() - 1)  # power of two: few distinct shapes


def plan_batches(
    cfg: ml_collections.ConfigDict, lengths: Sequence[int], limit: int | None = None
) -> list[tuple[list[int], int, int]]:
    """Groups sentence indices by padded source length: [(indices, rows, src_len)].

    `lengths` are source lengths incl. EOS (> 0), at most `limit` (default source_limit(cfg)),
    which also caps the padded length. Within a bucket, full batches have the bucket's row
    count; the remainder gets the next power of two (filled with dummy rows).
    """
    limit = source_limit(cfg) if limit is None else limit
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    buckets: dict[int, list[int]] = {}
    for i in order:
        padded = min(-(-lengths[i] // SRC_LEN_MULTIPLE) * SRC_LEN_MULTIPLE, limit)
        buckets.setdefault(padded, []).append(i)
    plan = []
    for src_len, idx in sorted(buckets.items()):
        rows = _rows_per_batch(cfg, src_len)
        for start in range(0, len(idx), rows):
            chunk = idx[start : start + rows]
            n = rows if len(chunk) == rows else 1 << (len(chunk) - 1).bit_length()
            plan.append((chunk, n, src_len))
    return plan


def translate_ids(
    cfg: ml_collections.ConfigDict,
    model: Transformer | Sequence[Transformer],
    params,
    sources: Sequence[Sequence[int]],
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_extra_len: int | None = None,
    greedy: bool = False,
    devices: Sequence[jax.Device] | None = None,
    stats: DecodeStats | None = None,
) -> list[np.ndarray]:
    """Source token ids (without EOS) -> output ids (without BOS, up to and incl. EOS), in order.

    beam_size, alpha and max_extra_len default to cfg.decode. An empty source gives an empty
    output without decoding. Sources longer than the model's limit are truncated with a warning.
    Output length is at most (source length incl. EOS) + max_extra_len (§6.1), and at most
    model.max_len (the position table).

    `model` and `params` may be sequences, one entry per model of an ensemble (same vocabulary):
    the search then follows the mean of their next-token probabilities, and the limits are the
    smallest member's. cfg's data and decode settings apply to all of them.

    Batches are dispatched without waiting and spread round-robin over `devices` (default:
    every local device, each holding a copy of the params), so several devices, or several CPU
    devices on a multi-core host (JAX_NUM_CPU_DEVICES), decode different batches at once. With
    model parallelism (mesh.model > 1) or several processes each batch runs on the whole mesh.
    `stats`, if given, collects the programs asked for and the sentences decoded twice.
    """
    stats = DecodeStats() if stats is None else stats
    beam_size = cfg.decode.beam_size if beam_size is None else beam_size
    alpha = cfg.decode.alpha if alpha is None else alpha
    max_extra_len = cfg.decode.max_extra_len if max_extra_len is None else max_extra_len
    if greedy:
        beam_size, alpha = 1, 0.0  # not used: keep them out of the jit cache key
    models, params = as_members(model, params)
    out_limit = min(m.max_len for m in models)
    limit = min(source_limit(cfg), out_limit)
    seqs: list[np.ndarray] = []
    truncated = []
    for n, ids in enumerate(sources):
        ids = list(ids)
        if len(ids) > limit - 1:
            truncated.append(n)
            ids = ids[: limit - 1]
        seqs.append(np.asarray(ids + [EOS_ID], np.int32) if ids else np.zeros(0, np.int32))
    if truncated:
        log.warning(
            "Truncated %d source line(s) to %d tokens (model limit incl. EOS); first lines: %s",
            len(truncated),
            limit,
            [n + 1 for n in truncated[:10]],
        )
    results = [np.zeros(0, np.int32) for _ in seqs]
    nonempty = [i for i, s in enumerate(seqs) if len(s)]
    first_extra = cfg.decode.first_pass_extra_len
    two_pass = 0 < first_extra < max_extra_len

    if devices is None:
        # Model parallelism, or several processes (params span other hosts' devices): every
        # batch runs as one program on the whole mesh, as the params are laid out.
        whole_mesh = cfg.mesh.model != 1 or jax.process_count() > 1
        devices = [None] if whole_mesh else jax.local_devices()
    placed = [params if d is None else jax.device_put(params, d) for d in devices]

    def run_plan(indices: list[int], short: bool) -> list[int]:
        """Decodes seqs[indices]; returns the indices a short buffer cut off."""
        pending = []
        plan = plan_batches(cfg, [len(seqs[i]) for i in indices], limit)
        for n, (chunk, rows, src_len) in enumerate(plan):
            inputs = np.full((rows, src_len), PAD_ID, np.int32)
            # Dummy rows: all PAD and one output token, so they finish at the first step.
            max_lengths = np.ones(rows, np.int32)
            for r, j in enumerate(chunk):
                s = seqs[indices[j]]
                inputs[r, : len(s)] = s
                max_lengths[r] = min(len(s) + max_extra_len, out_limit)
            extra = first_extra if short else max_extra_len
            device = devices[n % len(devices)]
            args = (inputs, max_lengths)
            if device is not None:
                args = jax.device_put(args, device)
            max_decode_len = min(src_len + extra, out_limit)
            program = (models, rows, src_len, max_decode_len, beam_size, float(alpha), greedy)
            stats.programs.add(program)
            out = _search(
                placed[n % len(devices)],
                *args,
                models=models,
                beam_size=beam_size,
                alpha=float(alpha),
                max_decode_len=max_decode_len,
                greedy=greedy,
            )  # dispatched; runs while the next batches are prepared and queued
            pending.append((chunk, max_lengths, out))
        redo = []
        for chunk, max_lengths, (out, complete) in pending:
            out, complete = np.asarray(out), np.asarray(complete)
            for r, j in enumerate(chunk):
                if not complete[r]:
                    redo.append(indices[j])
                    continue
                row = out[r]
                end = np.flatnonzero(row == EOS_ID)
                stop = int(end[0]) + 1 if len(end) else int(max_lengths[r])
                results[indices[j]] = row[:stop]
        return redo

    redo = run_plan(nonempty, short=True) if two_pass else nonempty
    stats.redecoded += len(redo) if two_pass else 0
    if run_plan(redo, short=False):
        raise AssertionError("a full-length decoding buffer cut a search short")  # never
    return results


def translate_texts(
    cfg: ml_collections.ConfigDict,
    model: Transformer | Sequence[Transformer],
    params,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_extra_len: int | None = None,
    greedy: bool = False,
    stats: DecodeStats | None = None,
) -> list[str]:
    """Detokenized translations of `texts`, in input order; an empty line gives an empty line.

    `model` and `params` may be an ensemble's (translate_ids)."""
    texts = [t.strip() for t in texts]
    sources = [
        ids if t else [] for t, ids in zip(texts, tokenizer.encode_batch(texts), strict=True)
    ]
    outputs = translate_ids(
        cfg,
        model,
        params,
        sources,
        beam_size=beam_size,
        alpha=alpha,
        max_extra_len=max_extra_len,
        greedy=greedy,
        stats=stats,
    )
    return [tokenizer.decode(ids) if len(ids) else "" for ids in outputs]
