"""§5.4 label-smoothed cross entropy over non-pad target tokens, as sums plus a token count."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfm_jax.vocab_ids import PAD_ID

Array = jax.Array


def cross_entropy_sums(logits: Array, targets: Array, label_smoothing: float) -> dict[str, Array]:
    """Sums over non-pad targets of the smoothed loss, the true NLL and correct argmaxes.

    logits [b, t, vocab], targets [b, t] (PAD_ID = not a token). The smoothed target puts
    1 - eps on the label and eps / (vocab - 1) on every other token (Szegedy et al. 2016, as in
    tensor2tensor); `loss` is the cross entropy against it (not the KL, so with eps > 0 its minimum
    is the smoothed distribution's entropy, not 0). `nll` is the plain -log p(label): exp(nll /
    tokens) is the per-token perplexity that the paper reports. Normalize only when logging.
    """
    vocab = logits.shape[-1]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, t, vocab]
    weights = (targets != PAD_ID).astype(jnp.float32)  # [b, t]
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [b, t]
    if label_smoothing > 0.0:
        off = label_smoothing / (vocab - 1)
        on = 1.0 - label_smoothing
        # -sum_v q_v log p_v with q = off everywhere except `on` at the label
        smoothed = on * nll - off * (jnp.sum(logp, axis=-1) + nll)
    else:
        smoothed = nll
    # label's log-prob >= the max log-prob <=> the label is an argmax. Cheaper than argmax on
    # CPU (a plain max-reduce that XLA shares with log_softmax, not a variadic value+index one).
    correct = (-nll >= jnp.max(logp, axis=-1)).astype(jnp.float32)
    return {
        "loss": jnp.sum(smoothed * weights),
        "nll": jnp.sum(nll * weights),
        "correct": jnp.sum(correct * weights),
        "tokens": jnp.sum(weights),
    }


def normalize_metrics(sums: dict[str, Array | float]) -> dict[str, float]:
    """Host-side: per-token loss, nll, perplexity and accuracy from summed metrics."""
    import math

    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    return {
        "loss": float(sums["loss"]) / tokens,
        "nll": nll,
        "ppl": math.exp(min(nll, 50.0)),
        "accuracy": float(sums["correct"]) / tokens,
        "tokens": float(sums["tokens"]),
    }
