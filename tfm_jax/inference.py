"""§6.1 inference: load a run's params, translate text in batches, evaluate a split.

The commands that call these live in inference_cli.py.

Decoding batches are shaped for few compilations: sentences are sorted by length, the source
length is rounded up to a multiple of SRC_LEN_MULTIPLE, and each length bucket is cut into
batches of a fixed number of rows (cfg.decode.tokens_per_batch // padded length, rounded down
to a power of two). A bucket's last batch takes the next power of two >= its sentences, padded
with dummy rows, so a test set compiles about two shapes per length bucket and translating one
sentence does not run a full-size batch. jax.jit caches one executable per (rows, source length,
max_decode_len, beam, alpha, greedy); `compile_count()` counts them.

Two passes (decode.first_pass_extra_len): every batch is first decoded with an output buffer of
(padded source length + first_pass_extra_len) tokens, and only the sentences whose search had
not ended by then are decoded again with the full (source length + max_extra_len) buffer. The
result is exactly that of one full-length pass (decode.py, "Short buffers"). On the quickstart
model no test sentence needed the second pass at 12 and beam-4 ran 1.28x faster.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from tfm_jax import checkpoint, data, decode, evaluate, losses, train, transformer
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.transformer import Transformer
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID

SRC_LEN_MULTIPLE = 16  # padded source lengths are multiples of this (one compile per bucket)

# Incremented while jax traces _search, i.e. once per compilation (a jit cache miss).
_COMPILATIONS = [0]
# Sentences a first, short-buffer pass left unfinished (decoded again at full length).
_REDECODED = [0]


class InferenceError(ValueError):
    """A user-fixable problem (missing workdir, checkpoint, vocabulary or input file)."""


def compile_count() -> int:
    """Decoding executables compiled so far in this process (one per distinct batch setup)."""
    return _COMPILATIONS[0]


def redecode_count() -> int:
    """Sentences decoded twice so far: the first, short-buffer pass (decode.first_pass_extra_len)
    did not finish them."""
    return _REDECODED[0]


# ----------------------------------------------------------------------------- loading


def _checkpoint_names(workdir: str) -> str:
    avg = os.path.isdir(os.path.join(workdir, checkpoint.AVERAGED_DIR))
    ckpt_dir = os.path.join(workdir, checkpoint.CHECKPOINTS_DIR)
    steps = sorted(
        int(n) for n in (os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []) if n.isdigit()
    )
    return f"averaged checkpoint: {'yes' if avg else 'no'}; steps: {steps or 'none'}"


def default_checkpoint(workdir: str) -> str:
    """CLI default: "averaged" (§6.1 averages the last checkpoints) if it exists, else latest."""
    return "averaged" if os.path.isdir(os.path.join(workdir, checkpoint.AVERAGED_DIR)) else "latest"


def check_workdir(workdir: str) -> None:
    if not workdir or not os.path.isdir(workdir):
        raise InferenceError(
            f"workdir {workdir!r} does not exist; pass the --workdir of a training run"
        )


def load_tokenizer(cfg: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
    """The run's vocabulary: data.vocab_path, else the one training cached under <workdir>/vocab.

    Never trains one: a new vocabulary would not match the model's embedding rows. Looking in
    <workdir>/vocab (rather than recomputing get_tokenizer's fingerprint) keeps evaluation of
    another folder (--config.data.dir=...) on the run's own vocabulary.
    """
    if cfg.data.vocab_path:
        if not os.path.isfile(cfg.data.vocab_path):
            raise InferenceError(f"data.vocab_path={cfg.data.vocab_path!r} does not exist")
        return Tokenizer.load(cfg.data.vocab_path, cfg.data.num_workers)
    pattern = os.path.join(workdir, "vocab", f"spm_{cfg.data.vocab_size}_*.model")
    found = sorted(glob.glob(pattern), key=os.path.getmtime)
    if not found:
        raise InferenceError(
            f"no vocabulary matches {pattern}; pass --config.data.vocab_path=<the run's "
            "sentencepiece .model>"
        )
    if len(found) > 1:
        logging.warning("Several vocabularies match %s; using the newest, %s", pattern, found[-1])
    return Tokenizer.load(found[-1], cfg.data.num_workers)


def load_for_inference(
    workdir: str, which: str | int, cfg: ml_collections.ConfigDict
) -> tuple[Transformer, Any, Tokenizer]:
    """(model, params, tokenizer) of `which` checkpoint: "averaged", "latest" or a step.

    A run trained with model.scan_layers comes back unrolled (the decoder's cache is per layer).
    """
    check_workdir(workdir)
    trainer = train.make_trainer(cfg)
    try:
        params = checkpoint.load_params(workdir, str(which), trainer.abstract_state.params)
    except checkpoint.CheckpointNotFoundError as e:
        raise InferenceError(f"{e} ({_checkpoint_names(workdir)})") from None
    except ValueError as e:  # a `which` that is neither a name nor a step
        raise InferenceError(f"--checkpoint={which}: {e}") from None
    tokenizer = load_tokenizer(cfg, workdir)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise InferenceError(
            f"the vocabulary has {tokenizer.vocab_size} pieces but model.vocab_size is "
            f"{cfg.model.vocab_size}; this vocabulary belongs to another run"
        )
    if cfg.model.scan_layers:
        model = trainer.model.clone(scan_layers=False)
        return model, transformer.unstack_layers(params, cfg.model.num_layers), tokenizer
    return trainer.model, params, tokenizer


# ----------------------------------------------------------------------------- decoding


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
    return jnp.where(special, decode.NEG_INF, logits)


def is_encoder_memory(path) -> bool:
    """Cache leaves projected from the encoder output (MultiHeadAttention's static_* variables):
    equal for every beam of a sentence, so beam search need not reorder them."""
    return any(getattr(k, "key", None) in ("static_key", "static_value") for k in path)


def cached_tokens_to_logits(model: Transformer, params, encoded: jax.Array, inputs: jax.Array):
    """decode.TokensToLogits over the model's KV cache (the "cache" collection)."""

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


@functools.partial(
    jax.jit, static_argnames=("model", "beam_size", "alpha", "max_decode_len", "greedy")
)
def _search(params, inputs, max_lengths, *, model, beam_size, alpha, max_decode_len, greedy):
    """Source ids [rows, S] -> (best output ids [rows, max_decode_len] (EOS, then PAD),
    complete [rows]: False where max_decode_len was too short for the search to end)."""
    _COMPILATIONS[0] += 1  # runs only while tracing
    rows = inputs.shape[0]
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)  # [rows, S, d]
    cache = init_cache(model, params, encoded, inputs, max_decode_len)
    if greedy:
        fn = cached_tokens_to_logits(model, params, encoded, inputs)
        return decode.greedy_search(
            fn, cache, batch_size=rows, max_decode_len=max_decode_len, max_lengths=max_lengths
        )
    # The encoder ran once per sentence; its output is repeated for the beams.
    encoded, inputs = decode.expand_to_beams((encoded, inputs), beam_size)
    fn = cached_tokens_to_logits(model, params, encoded, inputs)
    out = decode.beam_search(
        fn,
        cache,
        batch_size=rows,
        max_decode_len=max_decode_len,
        max_lengths=max_lengths,
        beam_size=beam_size,
        alpha=alpha,
        exact_beams="best",  # only the best is kept: stop once nothing can beat it
        beam_invariant=is_encoder_memory,
    )
    return out.sequences[:, 0], out.complete  # the best of each sentence


def source_limit(cfg: ml_collections.ConfigDict) -> int:
    """Longest source (tokens incl. EOS) the model takes: the data limit and the position table."""
    return min(cfg.data.max_len, cfg.model.max_len)


def _rows_per_batch(cfg: ml_collections.ConfigDict, src_len: int) -> int:
    rows = max(1, cfg.decode.tokens_per_batch // src_len)
    return 1 << (rows.bit_length() - 1)  # power of two: few distinct shapes


def plan_batches(
    cfg: ml_collections.ConfigDict, lengths: Sequence[int]
) -> list[tuple[list[int], int, int]]:
    """Groups sentence indices by padded source length: [(indices, rows, src_len)].

    `lengths` are source lengths incl. EOS (> 0). Within a bucket, full batches have the
    bucket's row count; the remainder gets the next power of two (filled with dummy rows).
    """
    limit = source_limit(cfg)
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
    model: Transformer,
    params,
    sources: Sequence[Sequence[int]],
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_extra_len: int | None = None,
    greedy: bool = False,
    devices: Sequence[jax.Device] | None = None,
) -> list[np.ndarray]:
    """Source token ids (without EOS) -> output ids (without BOS, up to and incl. EOS), in order.

    beam_size, alpha and max_extra_len default to cfg.decode. An empty source gives an empty
    output without decoding. Sources longer than the model's limit are truncated with a warning.
    Output length is at most (source length incl. EOS) + max_extra_len (§6.1), and at most
    model.max_len (the position table).

    Batches are dispatched without waiting and spread round-robin over `devices` (default:
    every local device, each holding a copy of the params), so several devices, or several CPU
    devices on a multi-core host (JAX_NUM_CPU_DEVICES), decode different batches at once. With
    model parallelism (mesh.model > 1) or several processes each batch runs on the whole mesh.
    """
    beam_size = cfg.decode.beam_size if beam_size is None else beam_size
    alpha = cfg.decode.alpha if alpha is None else alpha
    max_extra_len = cfg.decode.max_extra_len if max_extra_len is None else max_extra_len
    if greedy:
        beam_size, alpha = 1, 0.0  # not used: keep them out of the jit cache key
    limit = source_limit(cfg)
    out_limit = model.max_len
    seqs: list[np.ndarray] = []
    truncated = []
    for n, ids in enumerate(sources):
        ids = list(ids)
        if len(ids) > limit - 1:
            truncated.append(n)
            ids = ids[: limit - 1]
        seqs.append(np.asarray(ids + [EOS_ID], np.int32) if ids else np.zeros(0, np.int32))
    if truncated:
        logging.warning(
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
        plan = plan_batches(cfg, [len(seqs[i]) for i in indices])
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
            out = _search(
                placed[n % len(devices)],
                *args,
                model=model,
                beam_size=beam_size,
                alpha=float(alpha),
                max_decode_len=min(src_len + extra, out_limit),
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
    _REDECODED[0] += len(redo) if two_pass else 0
    if run_plan(redo, short=False):
        raise AssertionError("a full-length decoding buffer cut a search short")  # never
    return results


def translate_texts(
    cfg: ml_collections.ConfigDict,
    model: Transformer,
    params,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_extra_len: int | None = None,
    greedy: bool = False,
) -> list[str]:
    """Detokenized translations of `texts`, in input order; an empty line gives an empty line."""
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
    )
    return [tokenizer.decode(ids) if len(ids) else "" for ids in outputs]


# ----------------------------------------------------------------------------- evaluation


@functools.partial(jax.jit, static_argnames=("model", "label_smoothing"))
def _eval_sums(params, batch, *, model, label_smoothing):
    return train.eval_step(params, batch, model=model, label_smoothing=label_smoothing)


def resolve_split(cfg: ml_collections.ConfigDict, name: str) -> str:
    """Maps "validation" -> data.eval_split, "test" -> data.test_split, anything else as is."""
    return {"validation": cfg.data.eval_split, "test": cfg.data.test_split}.get(name, name)


def perplexity(cfg, model, params, tokenizer, split: str) -> dict[str, float]:
    """Per-token NLL and perplexity of the references (teacher forcing), as in Table 3."""
    total: dict[str, float] = {}
    for batch in data.make_eval_batches(cfg.data, tokenizer, split):
        sums = _eval_sums(params, batch, model=model, label_smoothing=cfg.loss.label_smoothing)
        for k, v in jax.device_get(sums).items():
            total[k] = total.get(k, 0.0) + float(v)
    return losses.normalize_metrics(total)


def _alpha_name(alpha: float) -> str:
    return f"{alpha:g}"


def evaluate_split(
    cfg: ml_collections.ConfigDict,
    model: Transformer,
    params,
    tokenizer: Tokenizer,
    split: str,
    *,
    workdir: str,
    alphas: Sequence[float] | None = None,
    out_dir: str | None = None,
    checkpoint_name: str = "averaged",
    greedy: bool = False,
) -> dict:
    """Decodes `split`, scores it and writes hypotheses and scores.json under out_dir.

    `split` may be "validation" / "test" (cfg.data.eval_split / test_split) or a split name.
    alphas default to (cfg.decode.alpha,). With several, each is decoded and scored under
    "by_alpha" and the top-level scores are the best alpha's by sacreBLEU: choose alpha on the
    validation split, as the paper did (§6.1), not on the test split.
    Out_dir defaults to <workdir>/eval/<checkpoint_name>.
    """
    alphas = tuple(alphas) if alphas else (cfg.decode.alpha,)
    name = resolve_split(cfg, split)
    out_dir = out_dir or os.path.join(workdir, "eval", str(checkpoint_name))
    os.makedirs(out_dir, exist_ok=True)
    sources, refs = data.load_split_texts(cfg.data, name)
    ppl = perplexity(cfg, model, params, tokenizer, name)

    by_alpha = {}
    for alpha in alphas:
        start = time.perf_counter()
        hyps = translate_texts(cfg, model, params, tokenizer, sources, alpha=alpha, greedy=greedy)
        seconds = time.perf_counter() - start
        suffix = f".alpha{_alpha_name(alpha)}" if len(alphas) > 1 else ""
        hyp_file = os.path.join(out_dir, f"{name}{suffix}.hyp.txt")
        with open(hyp_file, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
        sacre = evaluate.bleu(hyps, refs)
        by_alpha[_alpha_name(alpha)] = {
            "alpha": alpha,
            "bleu": sacre["score"],
            "bleu_signature": sacre["signature"],
            "chrf": evaluate.chrf(hyps, refs),
            "bleu_tok_compound": evaluate.paper_bleu(hyps, refs, cfg.data.target_lang),
            # Wall time of translate_texts, compilation included (one compile per shape).
            "sentences_per_s": len(sources) / seconds,
            "hyp_file": hyp_file,
        }
    best = max(by_alpha, key=lambda a: by_alpha[a]["bleu"])
    scores = {k: v for k, v in by_alpha[best].items() if k != "alpha"}
    scores.update(
        nll=ppl["nll"],
        ppl=ppl["ppl"],
        decode={
            "beam_size": 1 if greedy else cfg.decode.beam_size,
            "alpha": by_alpha[best]["alpha"],
            "max_extra_len": cfg.decode.max_extra_len,
            "first_pass_extra_len": cfg.decode.first_pass_extra_len,
            "greedy": greedy,
        },
        split=name,
        split_requested=split,
        checkpoint=str(checkpoint_name),
        workdir=workdir,
        num_sentences=len(sources),
        target_lang=cfg.data.target_lang,
    )
    if len(alphas) > 1:
        scores["by_alpha"] = by_alpha
        scores["alpha_selection"] = (
            f"top-level scores are alpha={best}, the best sacreBLEU on split {name!r}"
        )
    if len(alphas) > 1:  # the best alpha's hypotheses also under the plain name
        shutil.copyfile(by_alpha[best]["hyp_file"], os.path.join(out_dir, f"{name}.hyp.txt"))
    with open(os.path.join(out_dir, "scores.json"), "w") as f:
        json.dump(scores, f, indent=2)
    return scores
